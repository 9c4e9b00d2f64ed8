"""Pretraining of the embedded default base model (a small Qwen3 code LM) on the stdlib."""

from .config import ConfigError, PretrainConfig, load_config
from .trainer import train

__all__ = ["ConfigError", "PretrainConfig", "load_config", "train"]
