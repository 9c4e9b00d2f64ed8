"""Self-distillation of inducing adapters (DESIGN.md §6, §8).

`config` (YAML -> dataclasses), `data` (corpus + the base's own continuations, cached),
`objective` (one frozen forward -> per-exit forward KL), `metrics` (per-exit KL / top-1
agreement, the table), `loop` (accelerate / DeepSpeed training with exact resume), `publish`
(model card, Hub upload). Entry point: `train/distill.py`.
"""

__all__ = ["config", "data", "objective", "metrics", "loop", "publish"]
