"""Train the embedded default base model (Qwen3, from scratch, CPU) and its BPE tokenizer.

The corpus is the running interpreter's Python stdlib (test packages held out). Rerunning the
same command after a kill resumes from the last checkpoint in the config's `work_dir`.

    # tiny CPU variant (a few steps, tiny model, < 1 min)
    python train/pretrain_base.py --config configs/pretrain/tiny-test.yaml

    # the shipped model (checkpoints/dexcoder-16l), in the background (torch threads: see the config)
    nohup python train/pretrain_base.py --config configs/pretrain/dexcoder-16l.yaml \
        > runs/pretrain/dexcoder-16l.log 2>&1 &

    # the LayerSkip-style early-exit sibling (checkpoints/dexcoder-16l-ee)
    python train/pretrain_base.py --config configs/pretrain/dexcoder-16l-ee.yaml

Overrides: --max-steps, --out-dir, --work-dir (same type rules as the YAML).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dex_adapt.cli.common import run_with_clean_errors  # noqa: E402
from dex_adapt.pretrain import load_config, train  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", required=True, help="YAML file under configs/pretrain/")
    p.add_argument("--max-steps", type=int, help="override max_steps (resume continues to it)")
    p.add_argument("--out-dir", help="override out_dir")
    p.add_argument("--work-dir", help="override work_dir")
    args = p.parse_args(argv)
    overrides = {k: v for k, v in (("max_steps", args.max_steps), ("out_dir", args.out_dir),
                                   ("work_dir", args.work_dir)) if v is not None}

    def run() -> int:
        train(load_config(args.config, overrides), log=lambda m: print(m, flush=True))
        return 0

    return run_with_clean_errors("pretrain_base", run)


if __name__ == "__main__":
    sys.exit(main())
