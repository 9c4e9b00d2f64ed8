"""Pipelined DEX: one explorer (stage) per process/GPU over torch.distributed."""

from .dist import DistContext, PipelineFault, from_env
from .executor import PipelinedExecutor
from .partial_load import load_stage_model, materialized_parameters, owned_tensor_names

__all__ = ["DistContext", "PipelineFault", "from_env", "PipelinedExecutor", "load_stage_model",
           "materialized_parameters", "owned_tensor_names"]
