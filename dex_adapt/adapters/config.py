"""Configuration of the inducing-adapter PEFT method (DESIGN.md §6).

The config is what `adapter_config.json` holds. Besides the adapter's shape it records the base
model it was trained on (PEFT's own `base_model_name_or_path` and `revision`, plus
`base_fingerprint`) so that loading onto a different base is refused instead of silently giving
meaningless exits.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from peft.config import PeftConfig

# The `peft_type` string written into adapter_config.json. It is not a member of PEFT's own
# `PeftType` enum; PEFT's mapping tables are plain dicts and `PeftType` is a `str` enum, so a
# plain string key works everywhere PEFT looks a type up (see `model.register`).
from .checkpoint import PEFT_TYPE

__all__ = ["PEFT_TYPE", "KINDS", "ACTIVATIONS", "InducingConfig"]

KINDS = ("bottleneck", "affine")
ACTIVATIONS = ("gelu", "silu", "relu")


@dataclass
class InducingConfig(PeftConfig):
    """An inducing adapter at each exit depth: a residual, zero-initialised map on `h_d`.

    `bottleneck` (default): `h + U·act(D·norm(h))` with `U` zero-initialised.
    `affine` (tuned-lens translator): `h + A·h + b` with `A, b` zero-initialised.
    Either way an untrained adapter is exactly the logit lens, and the base model's own forward is
    never changed: the adapter only shapes what the exit at its depth sees.
    """

    exit_depths: Optional[list[int]] = field(
        default=None,
        metadata={"help": "Exit depths d (layers applied, 1..L-1); None = every depth, resolved at injection."},
    )
    kind: str = field(default="bottleneck", metadata={"help": f"Adapter kind, one of {KINDS}."})
    bottleneck_size: int = field(default=64, metadata={"help": "Inner width r of the bottleneck kind."})
    activation: str = field(default="gelu", metadata={"help": f"Bottleneck activation, one of {ACTIVATIONS}."})
    norm_eps: float = field(default=1e-6, metadata={"help": "Epsilon of the bottleneck's own RMSNorm."})
    num_hidden_layers: Optional[int] = field(
        default=None, metadata={"help": "L of the base model (recorded at injection)."}
    )
    hidden_size: Optional[int] = field(default=None, metadata={"help": "H of the base model (recorded)."})
    base_fingerprint: Optional[str] = field(
        default=None,
        metadata={"help": "Hash of the base config and unembedding (recorded at injection, checked at load)."},
    )
    target_modules: Optional[list[str]] = field(
        default=None,
        metadata={"help": "Decoder-layer module names that carry the adapters (derived from exit_depths)."},
    )
    modules_to_save: Optional[list[str]] = field(default=None, metadata={"help": "Unused; always None."})

    def __post_init__(self):
        super().__post_init__()
        self.peft_type = PEFT_TYPE
        if self.task_type is None:
            self.task_type = "CAUSAL_LM"
        if self.kind not in KINDS:
            raise ValueError(f"inducing adapter kind must be one of {KINDS}, got {self.kind!r}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"inducing adapter activation must be one of {ACTIVATIONS}, got {self.activation!r}")
        if self.bottleneck_size < 1:
            raise ValueError(f"bottleneck_size must be >= 1, got {self.bottleneck_size}")
        if self.exit_depths is not None:
            depths = sorted({int(d) for d in self.exit_depths})
            if not depths or depths[0] < 1:
                raise ValueError(f"exit_depths must be non-empty and >= 1, got {self.exit_depths}")
            self.exit_depths = depths
