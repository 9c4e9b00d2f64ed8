"""`DistillConfig`: every knob of an inducing-adapter self-distillation run, filled from YAML.

A config file has one mapping per concern (`model`, `adapter`, `data`, `train`, `hub`). Unknown
keys and wrongly-typed values are errors (`ConfigError`), so a typo never silently falls back to a
default. `--set section.key=value` overrides use the same rules (values parsed as YAML scalars).
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import yaml

from ..config_io import ConfigError, build_dataclass, read_yaml_mapping

__all__ = ["ConfigError", "ModelSection", "AdapterSection", "DataSection", "TrainSection", "HubSection",
           "DistillConfig", "load_config", "config_from_dict", "parse_override"]


@dataclass
class ModelSection:
    """The frozen base model."""

    path: str = ""
    """Local directory (or hub id where there is a network) of the base causal LM."""
    revision: Optional[str] = None
    """Hub revision of the base (recorded in the adapter config)."""
    dtype: str = "float32"
    """Dtype the frozen base is loaded in: float32, bfloat16 or float16."""
    hub_id: Optional[str] = None
    """Hub id to name as `base_model` in the model card when `path` is a local directory."""


@dataclass
class AdapterSection:
    """The inducing adapters (`dex_adapt.adapters.InducingConfig`)."""

    kind: str = "bottleneck"
    """bottleneck (`h + U·act(D·norm(h))`) or affine (`h + A·h + b`, the tuned-lens translator)."""
    bottleneck_size: int = 64
    """Inner width of the bottleneck kind."""
    activation: str = "gelu"
    """Bottleneck activation: gelu, silu or relu."""
    exit_depths: Optional[list[int]] = None
    """Depths (layers applied) that get an adapter; null = every depth 1..L-1."""


@dataclass
class DataSection:
    """Training/eval token blocks: a text corpus plus the base model's own continuations."""

    train_sources: list[str] = field(default_factory=lambda: ["stdlib:train"])
    """Corpus: files/globs (.txt/.py/.jsonl/.json/.parquet), `stdlib:train|heldout`, or `hub:<name>`."""
    eval_sources: list[str] = field(default_factory=lambda: ["stdlib:heldout"])
    """Held-out corpus for the per-exit agreement table."""
    text_field: str = "text"
    """Column holding the text in jsonl/json/parquet/hub sources."""
    seq_len: int = 256
    """Tokens per block; documents are packed, separated by EOS."""
    max_train_blocks: int = 2000
    """Cap on corpus blocks for training (0 = no cap)."""
    max_eval_blocks: int = 32
    """Cap on held-out blocks for evaluation."""
    prompts: str = "stdlib:train"
    """Prompts whose continuations by the base join the training data: stdlib:train, humaneval, none, or a jsonl."""
    num_prompts: int = 0
    """Use the first N prompts (0 = all; stdlib:train: 256)."""
    continuations_per_prompt: int = 1
    """Sampled continuations per prompt."""
    max_new_tokens: int = 128
    """Length of each continuation."""
    generation_temperature: float = 0.8
    """Sampling temperature of the continuations (0 = greedy)."""
    generation_batch_size: int = 16
    """Prompts per generate() call."""
    cache_dir: str = "runs/cache/distill"
    """Where built datasets are cached (keyed by a hash of everything that shapes them)."""
    seed: int = 0
    """Seeds corpus sampling and continuation sampling."""


@dataclass
class TrainSection:
    """Optimisation, logging and checkpointing."""

    output_dir: str = "runs/distill/run"
    """Final adapter checkpoint (adapter_config.json, adapter_model.safetensors, README.md, metrics.json)."""
    state_dir: Optional[str] = None
    """Resumable accelerate state (default: <output_dir>/state); never contains the frozen base."""
    steps: int = 500
    """Optimizer steps; the LR schedule is sized to this."""
    stop_after: int = 0
    """Stop (after saving state) at this step, to be resumed later (0 = run to `steps`)."""
    resume: bool = False
    """Resume from the latest state in `state_dir`."""
    micro_batch_size: int = 8
    """Blocks per process per forward."""
    grad_accum: int = 1
    """Micro-batches per optimizer step."""
    lr: float = 1e-3
    """Peak AdamW learning rate."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    warmup_steps: int = 20
    """Linear warmup steps, then cosine decay to `min_lr_ratio`."""
    min_lr_ratio: float = 0.1
    """Cosine floor as a fraction of `lr`."""
    grad_clip: float = 1.0
    """Global grad-norm clip (0 = off)."""
    temperature: float = 1.0
    """Distillation temperature tau: KL(softmax(z_L/tau) || softmax(z_d/tau)) * tau^2."""
    exits_per_step: int = 0
    """Exits trained per step, sampled (same on every rank); 0 = all exits every step."""
    seed: int = 0
    """Seeds adapter init, data order and exit sampling."""
    log_every: int = 10
    """Log per-exit train metrics to the trackers every N steps."""
    eval_every: int = 0
    """Evaluate on held-out blocks every N steps (0 = only at the end)."""
    save_every: int = 100
    """Save resumable state every N steps (0 = only at `stop_after`)."""
    report_to: str = "tensorboard"
    """Accelerate tracker(s): tensorboard, none, or a comma-separated list."""
    logging_dir: Optional[str] = None
    """Tracker directory (default: <output_dir>/logs)."""
    threads: int = 0
    """torch intra-op threads per process (0 = torch's default)."""


@dataclass
class HubSection:
    """Publishing the adapters (see `dex_adapt.publish`)."""

    push_to_hub: bool = False
    """Push the final checkpoint to the Hub."""
    repo_id: Optional[str] = None
    """user/name of the Hub repo."""
    private: bool = False
    """Create the repo private."""


@dataclass
class DistillConfig:
    model: ModelSection = field(default_factory=ModelSection)
    adapter: AdapterSection = field(default_factory=AdapterSection)
    data: DataSection = field(default_factory=DataSection)
    train: TrainSection = field(default_factory=TrainSection)
    hub: HubSection = field(default_factory=HubSection)

    def __post_init__(self) -> None:
        if not self.model.path:
            raise ConfigError("model.path is required (the base model directory or hub id)")
        if self.model.dtype not in ("float32", "bfloat16", "float16"):
            raise ConfigError(f"model.dtype must be float32, bfloat16 or float16, got {self.model.dtype!r}")
        if self.adapter.kind not in ("bottleneck", "affine"):
            raise ConfigError(f"adapter.kind must be bottleneck or affine, got {self.adapter.kind!r}")
        for name in ("steps", "micro_batch_size", "grad_accum"):
            if getattr(self.train, name) <= 0:
                raise ConfigError(f"train.{name} must be positive, got {getattr(self.train, name)}")
        if self.train.temperature <= 0:
            raise ConfigError("train.temperature must be positive")
        if self.data.seq_len < 2:
            raise ConfigError("data.seq_len must be >= 2")
        if self.hub.push_to_hub and not self.hub.repo_id:
            raise ConfigError("hub.push_to_hub needs hub.repo_id")

    @property
    def state_dir(self) -> str:
        return self.train.state_dir or str(Path(self.train.output_dir) / "state")

    @property
    def logging_dir(self) -> str:
        return self.train.logging_dir or str(Path(self.train.output_dir) / "logs")


# ----------------------------------------------------------------------------- loading
def config_from_dict(data: dict, source: str = "<dict>") -> DistillConfig:
    """Build a `DistillConfig`, rejecting unknown sections/keys and wrongly-typed values."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: top level must be a mapping, got {type(data).__name__}")
    sections = {f.name: typing.get_type_hints(DistillConfig)[f.name] for f in dataclasses.fields(DistillConfig)}
    unknown = sorted(set(data) - set(sections))
    if unknown:
        raise ConfigError(f"{source}: unknown section(s) {unknown}; known: {sorted(sections)}")
    try:
        return DistillConfig(**{name: build_dataclass(cls, data.get(name), source, name)
                                for name, cls in sections.items()})
    except ConfigError as e:
        msg = str(e)
        raise ConfigError(msg if msg.startswith(source) else f"{source}: {msg}") from None


def parse_override(text: str) -> tuple[str, str, object]:
    """`section.key=value` -> (section, key, YAML-parsed value)."""
    if "=" not in text or "." not in text.split("=", 1)[0]:
        raise ConfigError(f"override {text!r} must look like section.key=value")
    dotted, raw = text.split("=", 1)
    section, key = dotted.split(".", 1)
    try:
        value = yaml.safe_load(raw) if raw != "" else ""
    except yaml.YAMLError:
        raise ConfigError(f"override {text!r}: value is not valid YAML") from None
    return section, key, value


def load_config(path: str | Path, overrides: list[str] | None = None) -> DistillConfig:
    """Read a YAML config file, apply `section.key=value` overrides, validate."""
    data = read_yaml_mapping(path)
    for text in overrides or []:
        section, key, value = parse_override(text)
        if not isinstance(data.setdefault(section, {}), dict):
            raise ConfigError(f"{path}: section {section!r} must be a mapping")
        data[section][key] = value
    return config_from_dict(data, source=str(path))


def to_dict(cfg: DistillConfig) -> dict:
    return dataclasses.asdict(cfg)
