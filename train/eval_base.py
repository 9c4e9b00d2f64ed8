"""Evaluate a shipped base model: held-out perplexity and per-layer logit-lens agreement.

Prints the agreement table (markdown), writes `depth_agreement.json` and `depth_agreement.md`
into the model dir, and with --write-card renders the model's README.md from them.

    # the shipped model (a few minutes on one CPU thread)
    python train/eval_base.py --model-dir checkpoints/dexcoder-16l --write-card

    # tiny CPU variant (after `python train/pretrain_base.py --config configs/pretrain/tiny-test.yaml`)
    python train/eval_base.py --model-dir runs/pretrain/tiny-test/out --snippets 2 --humaneval 2 --new-tokens 8
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from dex_adapt.cli.common import run_with_clean_errors  # noqa: E402
from dex_adapt.pretrain.evaluate import evaluate  # noqa: E402
from dex_adapt.pretrain.model_card import write_card  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-dir", default="checkpoints/dexcoder-16l", help="saved HF model + tokenizer")
    p.add_argument("--snippets", type=int, default=16, help="held-out stdlib test snippets")
    p.add_argument("--snippet-chars", type=int, default=2048, help="characters per snippet")
    p.add_argument("--humaneval", type=int, default=16, help="HumanEval prompts continued greedily")
    p.add_argument("--new-tokens", type=int, default=32, help="greedy tokens per HumanEval prompt")
    p.add_argument("--seed", type=int, default=0, help="snippet sampling seed")
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    p.add_argument("--write-card", action="store_true", help="render README.md in the model dir")
    p.add_argument("--train-config", default=None,
                   help="training config path to cite in the card (default configs/pretrain/<dir name>.yaml)")
    p.add_argument("--card-only", action="store_true",
                   help="only re-render README.md from the JSON already in the model dir")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    model_dir = Path(args.model_dir)

    def run() -> int:
        if not args.card_only:
            ev = evaluate(model_dir, n_snippets=args.snippets, snippet_chars=args.snippet_chars,
                          n_humaneval=args.humaneval, new_tokens=args.new_tokens, seed=args.seed,
                          log=lambda m: print(m, flush=True))
            table = ev.table()
            print(table)
            (model_dir / "depth_agreement.json").write_text(json.dumps(ev.to_json(), indent=2))
            (model_dir / "depth_agreement.md").write_text(table + "\n")
        if args.write_card or args.card_only:
            print(f"wrote {write_card(model_dir, args.train_config)}")
        return 0

    return run_with_clean_errors("eval_base", run)


if __name__ == "__main__":
    sys.exit(main())
