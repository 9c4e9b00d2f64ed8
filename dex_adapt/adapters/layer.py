"""The inducing adapter itself, and the PEFT tuner layer that carries it.

`InducingAdapter` is the exit-side map `[..., H] -> [..., H]` (residual included). It is what the
decoder receives from `load_exit_adapters`, and what training optimises.

`InducingLayer` wraps decoder layer `d-1` (whose output is `h_d`) so that PEFT's machinery
(state dicts, trainability, multiple named adapters, save/load) sees an ordinary tuner layer. Its
forward is the wrapped layer's forward, unchanged: the adapter acts only at the exit, never on
the residual stream that deeper layers read. That is what keeps DEX lossless.
"""

from __future__ import annotations

import torch
from torch import nn
from peft.tuners.tuners_utils import BaseTunerLayer

from .config import InducingConfig

__all__ = ["InducingAdapter", "InducingLayer"]

_ACTIVATIONS = {"gelu": nn.GELU, "silu": nn.SiLU, "relu": nn.ReLU}


class InducingAdapter(nn.Module):
    """Residual, zero-initialised map on the hidden state at one exit depth.

    bottleneck: `h + up(act(down(norm(h))))`, `up` zero-initialised.
    affine:     `h + A·h + b`, `A` and `b` zero-initialised (the tuned-lens translator).

    The arithmetic runs in the adapter's own dtype (float32 while training a bf16 base) and the
    result is cast back to the input's dtype. At zero init the output is bit-identical to the input,
    so an untrained adapter *is* the logit lens.
    """

    def __init__(self, hidden_size: int, kind: str = "bottleneck", bottleneck_size: int = 64,
                 activation: str = "gelu", norm_eps: float = 1e-6) -> None:
        super().__init__()
        self.kind = kind
        if kind == "bottleneck":
            self.norm = nn.RMSNorm(hidden_size, eps=norm_eps)
            self.down = nn.Linear(hidden_size, bottleneck_size)
            self.act = _ACTIVATIONS[activation]()
            self.up = nn.Linear(bottleneck_size, hidden_size)
            nn.init.normal_(self.down.weight, std=hidden_size**-0.5)
            nn.init.zeros_(self.down.bias)
            nn.init.zeros_(self.up.weight)
            nn.init.zeros_(self.up.bias)
        elif kind == "affine":
            self.linear = nn.Linear(hidden_size, hidden_size)
            nn.init.zeros_(self.linear.weight)
            nn.init.zeros_(self.linear.bias)
        else:
            raise ValueError(f"unknown inducing adapter kind {kind!r}")

    @classmethod
    def from_config(cls, config: InducingConfig, hidden_size: int) -> "InducingAdapter":
        return cls(hidden_size, config.kind, config.bottleneck_size, config.activation, config.norm_eps)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """`[..., H] -> [..., H]`, residual included."""
        dtype = next(self.parameters()).dtype
        x = hidden.to(dtype)
        if self.kind == "bottleneck":
            delta = self.up(self.act(self.down(self.norm(x))))
        else:
            delta = self.linear(x)
        return (x + delta).to(hidden.dtype)


class InducingLayer(nn.Module, BaseTunerLayer):
    """Decoder layer `d-1` wrapped to carry the inducing adapter(s) of exit depth `d`.

    `inducing_adapter` maps adapter name -> `InducingAdapter`. Forward delegates to the wrapped
    layer untouched; use `exit_adapters()` (model.py) to reach the adapters.
    """

    adapter_layer_names = ("inducing_adapter",)
    other_param_names = ("exit_depth",)

    def __init__(self, base_layer: nn.Module, exit_depth: int, adapter_name: str,
                 config: InducingConfig, hidden_size: int) -> None:
        super().__init__()
        self.base_layer = base_layer
        self.exit_depth = exit_depth
        self.inducing_adapter = nn.ModuleDict({})
        self._active_adapter = adapter_name
        self.merged_adapters = []
        self.update_layer(adapter_name, config, hidden_size)

    def update_layer(self, adapter_name: str, config: InducingConfig, hidden_size: int) -> None:
        adapter = InducingAdapter.from_config(config, hidden_size)
        weight = _first_floating_param(self.base_layer)
        if weight is not None and weight.device.type != "meta":
            adapter = adapter.to(weight.device)
        self.inducing_adapter[adapter_name] = adapter
        self.set_adapter(self.active_adapters, inference_mode=config.inference_mode)

    def merge(self, safe_merge: bool = False, adapter_names=None) -> None:
        raise NotImplementedError("inducing adapters act only at exits; there is nothing to merge into the base")

    def unmerge(self) -> None:
        raise NotImplementedError("inducing adapters are never merged")

    def forward(self, *args, **kwargs):
        # The base model's own forward is exactly the wrapped layer's (losslessness, DESIGN.md §3).
        return self.base_layer(*args, **kwargs)

    def __getattr__(self, name: str):
        # HF model code reads attributes off its decoder layers (e.g. `attention_type`).
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name == "base_layer":
                raise
            return getattr(self.base_layer, name)

    def __repr__(self) -> str:
        return "inducing." + super().__repr__()


def _first_floating_param(module: nn.Module):
    for p in module.parameters():
        if p.is_floating_point():
            return p
    return None
