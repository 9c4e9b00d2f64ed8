"""``dex-ead``: where in depth does each committed token become available? (DESIGN.md §2)

Decodes each prompt with plain greedy AR, records every layer's exit prediction per committed token
(logit lens, and through the inducing adapters when ``--adapters`` is given), and writes
``ead.json`` (EAD histogram in layers, per-depth top-1 agreement with the final token, and per
exploration set the per-token oracle exit and shallowest-match exit) plus ``ead_histogram.png``
and ``agreement.png`` (lens and adapters on one chart).

Examples::

    dex-ead --model checkpoints/dexcoder-16l --num-prompts 20 --out results/dexcoder-16l/ead
    dex-ead --adapters checkpoints/dexcoder-16l-dex --humaneval 0,1,2 --exits 4,8,12,16 --out /tmp/ead
    dex-ead --model tiny/ --prompt-ids 1,2,3 --max-new-tokens 16 --out /tmp/ead   # no tokenizer

Bad input exits with status 2 and one line on stderr.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from .common import (CliError, OneLineParser, default_model_path, positive_int, quiet_libraries,
                     run_with_clean_errors, write_json_atomic)

__all__ = ["main", "build_parser", "add_prompt_args", "load_prompt_set", "load_model_and_adapters"]


def add_prompt_args(p: argparse.ArgumentParser, default_count: int) -> None:
    src = p.add_argument_group("prompts (default: the first --num-prompts HumanEval prompts)")
    src.add_argument("--humaneval", help="HumanEval task indices, e.g. 0,1,2 or 0-19")
    src.add_argument("--num-prompts", type=positive_int, default=default_count,
                     help=f"first N HumanEval prompts when no other source is given (default {default_count})")
    src.add_argument("--prompt", action="append", default=[], help="prompt text (repeatable)")
    src.add_argument("--prompts", help="JSONL file, one object per line with a 'prompt' field")
    src.add_argument("--prompt-ids", action="append", default=[], help="comma-separated token ids (repeatable)")


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="base model directory (default: the adapters' base, else the shipped model)")
    p.add_argument("--adapters", help="inducing-adapter checkpoint; compared with the logit lens")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--threads", type=positive_int, help="torch CPU threads (default: torch's choice)")


def _indices(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            if "-" in part:
                a, b = part.split("-", 1)
                out.extend(range(int(a), int(b) + 1))
            else:
                out.append(int(part))
        except ValueError:
            raise CliError(f"--humaneval must be indices or ranges like 0,3,5-9, got {text!r}") from None
    return out


def load_prompt_set(args, tokenizer) -> list[tuple[str, list[int]]]:
    """(name, token ids) for every prompt asked for; HumanEval by default."""
    from .decode import read_jsonl_prompts

    texts: list[tuple[str, str]] = [(f"prompt[{i}]", t) for i, t in enumerate(args.prompt)]
    if args.prompts:
        texts += [(f"{Path(args.prompts).name}[{i}]", t) for i, t in enumerate(read_jsonl_prompts(args.prompts))]
    ids = [(f"ids[{i}]", _int_list(t)) for i, t in enumerate(args.prompt_ids)]
    if args.humaneval or not (texts or ids):
        from ..prompts import humaneval_prompts

        tasks = humaneval_prompts()
        chosen = _indices(args.humaneval) if args.humaneval else list(range(min(args.num_prompts, len(tasks))))
        for i in chosen:
            if not 0 <= i < len(tasks):
                raise CliError(f"--humaneval index {i} out of range 0..{len(tasks) - 1}")
            texts.append((tasks[i]["task_id"], tasks[i]["prompt"]))
    if texts and tokenizer is None:
        raise CliError("the model directory has no tokenizer: use --prompt-ids")
    prompts = [(name, tokenizer.encode(text)) for name, text in texts] + ids
    for name, p in prompts:
        if not p:
            raise CliError(f"prompt {name} is empty")
    return prompts


def _int_list(text: str) -> list[int]:
    try:
        return [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise CliError(f"--prompt-ids must be comma-separated integers, got {text!r}") from None


def load_model_and_adapters(args):
    """(model, adapters or None, model path, tokenizer or None) from --model/--adapters/--device."""
    import torch

    from ..model_surgery import load_causal_lm
    from .decode import load_tokenizer

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise CliError("--device cuda given but no CUDA device is available")
    if args.adapters and not os.path.isdir(args.adapters):
        raise CliError(f"adapter checkpoint not found: {args.adapters}")
    if args.model:
        path = args.model
    elif args.adapters:
        from ..adapters import base_model_path

        path = base_model_path(args.adapters)
    else:
        path = str(default_model_path())
    model = load_causal_lm(path, torch.float32, args.device)
    adapters = None
    if args.adapters:
        from ..adapters import load_exit_adapters

        adapters = load_exit_adapters(args.adapters, model)
    return model, adapters, path, load_tokenizer(path)


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser.from_doc("dex-ead", __doc__)
    add_model_args(p)
    add_prompt_args(p, default_count=20)
    p.add_argument("--max-new-tokens", type=positive_int, default=64)
    p.add_argument("--exits", action="append", default=[],
                   help="exploration set for the per-exit view, e.g. 4,8,12,16 (repeatable; default: every "
                        "uniform split into a divisor of the layer count)")
    p.add_argument("--out", help="output directory (default: results/<model-name>/ead)")
    return p


def run(args) -> int:
    from tqdm import tqdm

    from ..baselines import shallowest_match_exits
    from ..bench import divisor_explorers
    from ..ead import ead_depth, ead_summary, exit_summary, exit_trace, record_traces
    from ..exploration import ExplorationSet
    from ..report import plot_ead

    model, adapters, path, tokenizer = load_model_and_adapters(args)
    L = model.config.num_hidden_layers
    sets = [ExplorationSet.parse(e, L) for e in args.exits] or [
        ExplorationSet.uniform(n, L) for n in divisor_explorers(L)]
    prompts = load_prompt_set(args, tokenizer)
    out = Path(args.out or Path("results") / Path(path).name / "ead")
    with tqdm(total=len(prompts), desc="dex-ead", unit="prompt", file=sys.stderr, disable=len(prompts) < 2) as bar:
        traces = record_traces(model, [p for _, p in prompts], args.max_new_tokens, adapters, progress=bar)
    modes = {"lens": False, **({"adapters": True} if adapters else {})}
    summaries = {name: ead_summary(traces, mode) for name, mode in modes.items()}
    per_set = []
    for x in sets:
        entry = {"exits": list(x.exits)}
        for name, mode in modes.items():
            ets = [exit_trace(t, x, mode) for t in traces]
            entry[name] = {**exit_summary(traces, x, mode),
                           "oracle_exit": [list(e.ead_exit) for e in ets],
                           "shallowest_match_exit": [[x.num_stages - 1 if s is None else s
                                                      for s in shallowest_match_exits(e)] for e in ets]}
        per_set.append(entry)
    result = {
        "model": path, "adapters": args.adapters, "max_new_tokens": args.max_new_tokens, "num_layers": L,
        "adapter_depths": sorted(adapters) if adapters else [],
        "prompts": [{"name": n, "prompt_tokens": len(p), "new_tokens": len(t.tokens)} for (n, p), t in zip(prompts, traces)],
        **summaries,
        "per_token_ead": [{name: [ead_depth(row, x) for row, x in zip(t.table(mode), t.tokens)]
                           for name, mode in modes.items()} for t in traces],
        "exploration_sets": per_set,
    }
    write_json_atomic(str(out / "ead.json"), result)
    plots = plot_ead(summaries, out, title=f"({Path(path).name})")
    for name, s in summaries.items():
        if not s["tokens"]:
            print(f"{name}: no tokens committed")
            continue
        print(f"{name}: {s['tokens']} tokens, mean EAD {s['mean_ead']:.2f} of {L} layers; agreement by depth "
              + " ".join(f"{a:.2f}" for a in s["agreement"]))
    print(f"wrote {out / 'ead.json'}, " + ", ".join(plots))
    return 0


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    quiet_libraries()
    return run_with_clean_errors("dex-ead", lambda: run(args))


if __name__ == "__main__":
    sys.exit(main())
