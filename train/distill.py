"""Train inducing adapters by self-distillation on a frozen base model.

Exact commands (run from the repository root):

    # the shipped adapters for the embedded base (CPU, ~15 min):
    accelerate launch --config_file configs/accelerate/single.yaml train/distill.py \
        --config configs/distill/dexcoder-16l.yaml

    # a tiny CPU smoke run (override any field with --set section.key=value):
    accelerate launch --config_file configs/accelerate/single.yaml train/distill.py \
        --config configs/distill/dexcoder-16l.yaml --set train.steps=20 --set train.output_dir=runs/distill/smoke

    # DeepSpeed ZeRO-2 on 2 processes (CPU: gloo; on GPUs: NCCL), or ZeRO-3 with a sharded frozen base:
    accelerate launch --config_file configs/accelerate/zero2.yaml --num_processes 2 train/distill.py --config ...
    accelerate launch --config_file configs/accelerate/zero3.yaml train/distill.py --config configs/distill/qwen3-32b.yaml

    # stop after 100 steps, then resume (ends with the same adapter weights as an uninterrupted run):
    ... train/distill.py --config X.yaml --set train.stop_after=100
    ... train/distill.py --config X.yaml --set train.resume=true

    # push the result to the Hub when done:
    ... train/distill.py --config X.yaml --push-to-hub --hub-repo-id user/name [--hub-private]

Writes to `train.output_dir`: adapter_config.json + adapter_model.safetensors (a PEFT adapter),
metrics.json, README.md (model card with the per-exit agreement table), logs/ (TensorBoard) and
state/ (resumable accelerate state, adapter weights + optimizer only).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="YAML config (see configs/distill/)")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override one config field (repeatable)")
    parser.add_argument("--push-to-hub", action="store_true", help="push the final checkpoint to the Hub")
    parser.add_argument("--hub-repo-id", help="user/name of the Hub repo (with --push-to-hub)")
    parser.add_argument("--hub-private", action="store_true", help="create the Hub repo private")
    args = parser.parse_args(argv)

    from dex_adapt.distill.config import ConfigError, load_config

    overrides = list(args.set)
    if args.push_to_hub:
        overrides.append("hub.push_to_hub=true")
    if args.hub_repo_id:
        overrides.append(f"hub.repo_id={args.hub_repo_id}")
    if args.hub_private:
        overrides.append("hub.private=true")
    try:
        cfg = load_config(args.config, overrides)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from dex_adapt.adapters import BaseModelMismatchError
    from dex_adapt.distill.loop import train
    from dex_adapt.model_surgery import UnsupportedModelError

    launcher = "accelerate launch" if any(k.startswith("ACCELERATE_") for k in os.environ) else "python"
    command = f"{launcher} train/distill.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    try:
        train(cfg, command=command)
    except (FileNotFoundError, BaseModelMismatchError, UnsupportedModelError, OSError) as e:
        print(f"error: {str(e).splitlines()[0] if str(e) else type(e).__name__}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
