"""`PretrainConfig`: every knob of a base-model pretraining run, filled from a YAML file.

Unknown keys and wrong types are errors (`ConfigError`), so a typo in a config never silently
falls back to a default.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from ..config_io import ConfigError, build_dataclass, read_yaml_mapping

__all__ = ["ConfigError", "PretrainConfig", "load_config"]


@dataclass
class PretrainConfig:
    """A from-scratch Qwen3 pretraining run on the running interpreter's stdlib."""

    # --- where things go ---
    out_dir: str = "checkpoints/dexcoder-16l"
    """Final HF model + tokenizer + loss curve (what ships)."""
    work_dir: str = "runs/pretrain/dexcoder-16l"
    """Resumable state: token cache, tokenizer, periodic checkpoints, loss log (never shipped)."""
    seed: int = 0
    """Seeds the file shuffle, chunk order, init and layer dropout."""

    # --- data ---
    max_train_files: int = 0
    """Use only the first N training files after the seeded shuffle (0 = all)."""
    max_heldout_files: int = 0
    """Use only the first N held-out files after the seeded shuffle (0 = all)."""
    vocab_size: int = 8192
    """Byte-level BPE vocabulary size, `<|endoftext|>` included."""

    # --- model (Qwen3ForCausalLM) ---
    num_layers: int = 16
    """Decoder layers."""
    hidden_size: int = 256
    """Residual width."""
    intermediate_size: int = 704
    """SwiGLU MLP width."""
    num_heads: int = 4
    """Query heads."""
    num_kv_heads: int = 2
    """Key/value heads (grouped-query attention)."""
    head_dim: int = 64
    """Per-head width."""
    context_length: int = 512
    """Training sequence length and `max_position_embeddings`."""
    rope_theta: float = 10000.0
    """RoPE base."""

    # --- optimisation ---
    batch_size: int = 4
    """Sequences per step; tokens per step = batch_size * context_length."""
    max_steps: int = 1000
    """Optimizer steps; the LR schedule is sized to this (unless the time budget ends it first)."""
    time_budget_s: float = 0.0
    """Wall-clock training budget across resumes (0 = off). The cosine decay follows whichever of
    steps/max_steps and elapsed/time_budget_s is further along, and training stops when either
    reaches 1, so a run on a shared machine still ends on time with a fully decayed LR."""
    lr: float = 1e-3
    """Peak learning rate (AdamW)."""
    min_lr_ratio: float = 0.1
    """Cosine decay floor as a fraction of `lr`."""
    warmup_steps: int = 50
    """Linear warmup steps."""
    weight_decay: float = 0.1
    """AdamW decoupled weight decay on matrices (not norms)."""
    beta1: float = 0.9
    """AdamW beta1."""
    beta2: float = 0.95
    """AdamW beta2."""
    grad_clip: float = 1.0
    """Global grad-norm clip (0 = off)."""
    threads: int = 2
    """torch intra-op threads."""

    # --- bookkeeping ---
    checkpoint_every: int = 50
    """Write resumable state every N steps (and at the end)."""
    eval_tokens: int = 65536
    """Held-out tokens scored for the final perplexity in the training summary."""

    # --- early exit (LayerSkip-style) ---
    early_exit: bool = False
    """Train every layer's output through the final norm + shared head as well as the last."""
    ee_layers_per_step: int = 4
    """Intermediate layers given an early-exit loss per step (sampled, saves time/memory)."""
    ee_loss_scale: float = 1.0
    """Total weight of the early-exit losses relative to the final-layer loss."""
    layer_dropout_max: float = 0.2
    """Dropout probability of the last layer; rises linearly from 0 at the first."""

    def __post_init__(self) -> None:
        if self.hidden_size != self.num_heads * self.head_dim:
            raise ConfigError(
                f"hidden_size ({self.hidden_size}) must equal num_heads*head_dim "
                f"({self.num_heads}*{self.head_dim})"
            )
        if self.num_heads % self.num_kv_heads:
            raise ConfigError("num_heads must be a multiple of num_kv_heads")
        for name in ("num_layers", "hidden_size", "batch_size", "max_steps", "context_length",
                     "vocab_size", "checkpoint_every", "threads"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")
        if not 0.0 <= self.layer_dropout_max < 1.0:
            raise ConfigError("layer_dropout_max must be in [0, 1)")

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.context_length


def config_from_dict(data: dict, source: str = "<dict>") -> PretrainConfig:
    """Build a `PretrainConfig`, rejecting unknown keys and wrongly-typed values."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: top level must be a mapping, got {type(data).__name__}")
    try:
        return build_dataclass(PretrainConfig, data, source)
    except ConfigError as e:
        msg = str(e)
        raise ConfigError(msg if msg.startswith(source) else f"{source}: {msg}") from None


def load_config(path: str | Path, overrides: dict | None = None) -> PretrainConfig:
    """Read a YAML config file, apply `overrides` (same key/type rules), validate."""
    data = read_yaml_mapping(path)
    data.update(overrides or {})
    return config_from_dict(data, source=str(path))


def to_dict(cfg: PretrainConfig) -> dict:
    return dataclasses.asdict(cfg)
