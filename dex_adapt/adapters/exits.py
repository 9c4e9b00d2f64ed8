"""Exits through inducing adapters: the decoder's seam, saving, and exit logits for training/eval.

Exit at depth `d` (DESIGN.md §2): `lm_head(final_norm(A_d(h_d)))`, where `h_d` is HF's
`output_hidden_states[d]` for `d < L` (the residual stream before the final norm) and `A_d` is the
inducing adapter (identity where there is none: the logit lens). Depth `L` is the model's own head.
"""

from __future__ import annotations

import json
import os

import torch
from torch import nn

from ..files import restore_ordinary_modes
from .checkpoint import CONFIG_NAME, WEIGHTS_NAME, base_model_path, read_adapter_config
from .config import InducingConfig
from .layer import InducingAdapter
from .model import BaseModelMismatchError, check_fingerprint, final_norm, unembedding

__all__ = ["load_exit_adapters", "base_model_path", "save_exit_adapters", "exit_logits", "read_adapter_config"]


def load_exit_adapters(ckpt_dir: str, model: nn.Module) -> dict[int, nn.Module]:
    """depth -> adapter module `[..., H] -> [..., H]` (residual included) for `model`.

    Modules are in the model's dtype and device, in eval mode, with gradients off. Raises
    `BaseModelMismatchError` (a ValueError, one line) when the checkpoint was trained on another base.
    """
    from safetensors.torch import load_file

    raw = read_adapter_config(ckpt_dir)
    config = InducingConfig.from_pretrained(ckpt_dir)
    num_layers, hidden = model.config.num_hidden_layers, model.config.hidden_size
    if (config.num_hidden_layers, config.hidden_size) != (num_layers, hidden):
        raise BaseModelMismatchError(
            f"adapters in {ckpt_dir} were trained on a base with {config.num_hidden_layers} layers and hidden size "
            f"{config.hidden_size}, but the given model has {num_layers} and {hidden}"
        )
    check_fingerprint(config, model)
    weights_path = os.path.join(ckpt_dir, WEIGHTS_NAME)
    if not os.path.isfile(weights_path):
        raise FileNotFoundError(f"no {WEIGHTS_NAME} in adapter checkpoint {ckpt_dir}")
    state = load_file(weights_path)
    param = unembedding(model).weight
    adapters: dict[int, nn.Module] = {}
    for depth, module_name in zip(raw["exit_depths"], raw["target_modules"]):
        prefix = f"base_model.model.{module_name}.inducing_adapter."
        own = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
        adapter = InducingAdapter.from_config(config, hidden)
        adapter.load_state_dict(own, strict=True)
        adapters[depth] = adapter.to(device=param.device, dtype=param.dtype).eval().requires_grad_(False)
    return adapters


def save_exit_adapters(peft_model: nn.Module, out_dir: str, state_dict: dict | None = None,
                       base: str | None = None) -> None:
    """`peft_model.save_pretrained(out_dir)`, recording `base` relative to `out_dir` when it is local.

    `state_dict` (full parameter names, as from `named_parameters`) lets a distributed trainer pass
    the adapter weights it gathered; only adapter weights are ever written.
    """
    peft_model.save_pretrained(out_dir, state_dict=state_dict)
    restore_ordinary_modes(out_dir)
    if base is None:
        return
    path = os.path.join(out_dir, CONFIG_NAME)
    with open(path) as f:
        raw = json.load(f)
    raw["base_model_name_or_path"] = os.path.relpath(base, out_dir) if os.path.isdir(base) else base
    with open(path, "w") as f:
        f.write(json.dumps(raw, indent=2, sort_keys=True))


@torch.no_grad()
def exit_logits(model: nn.Module, adapters: dict[int, nn.Module] | None, input_ids: torch.Tensor,
                attention_mask: torch.Tensor | None = None,
                depths: list[int] | None = None) -> dict[int, torch.Tensor]:
    """depth -> logits `[B, T, V]` for every exit in one forward; depth `L` is the model's own head.

    `depths` defaults to every depth `1..L`. A depth without an adapter is the logit lens.
    """
    adapters = adapters or {}
    num_layers = model.config.num_hidden_layers
    out = model(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True, use_cache=False)
    norm, head = final_norm(model), unembedding(model)
    result = {}
    for d in depths or range(1, num_layers + 1):
        if d == num_layers:
            result[d] = out.logits
            continue
        h = out.hidden_states[d]
        if d in adapters:
            h = adapters[d](h)
        result[d] = head(norm(h))
    return result
