"""Benchmark DEX against depth selection, the EAD oracle and HF on one prompt set (DESIGN.md §4).

Writes ``<out>/bench.json`` (``{"model", "prompts", "runs": [...]}``, one run per method and setting;
schema in ``dex_adapt/bench.py``), ``bench.md`` (tables) and PNG plots (ticks/token, speedup,
headroom realised, stage-forwards per token vs N; EAD histogram and per-depth agreement).

Commands::

    # the shipped model on HumanEval (lens; add --adapters checkpoints/dexcoder-16l-dex for both)
    python decode/bench.py --model checkpoints/dexcoder-16l --num-prompts 8 --max-new-tokens 48 \\
        --explorers 2,4,8,16 --threads 2 --out results/dexcoder-16l
    # adapters only (same prompts and settings), then one table and plots with both
    python decode/bench.py --adapters checkpoints/dexcoder-16l-dex --no-lens --num-prompts 8 \
        --max-new-tokens 48 --explorers 2,4,8,16 --threads 2 --out results/dexcoder-16l-dex
    python decode/bench.py --replot results/dexcoder-16l/bench.json results/dexcoder-16l-dex/bench.json \
        --out results/dexcoder-16l-dex/combined
    # CI / a laptop: tiny prompt set, few settings, well under a minute on a small model
    python decode/bench.py --quick --model /path/to/tiny --prompt-ids 1,2,3 --out /tmp/bench

Bad input exits with status 2 and one line on stderr.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable without installing
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dex_adapt.cli.common import (CliError, OneLineParser, positive_int, quiet_libraries, run_with_clean_errors,
                                  write_json_atomic)
from dex_adapt.cli.ead import add_model_args, add_prompt_args, load_model_and_adapters, load_prompt_set


def _ints(text: str, allow_inf: bool = False) -> tuple:
    out = []
    for t in text.split(","):
        t = t.strip()
        if not t:
            continue
        if allow_inf and t in ("inf", "none", "unbounded"):
            out.append(None)
            continue
        try:
            out.append(int(t))
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    return tuple(out)


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser.from_doc("bench.py", __doc__)
    add_model_args(p)
    add_prompt_args(p, default_count=8)
    p.add_argument("--max-new-tokens", type=positive_int, default=48)
    p.add_argument("--explorers", type=_ints, help="uniform N to sweep, e.g. 2,4,8,16 (default: every divisor of L)")
    p.add_argument("--exits", action="append", help="a non-uniform exploration set, e.g. 8,12,14,16 (repeatable; "
                                                    "default: a late-dense and an early-dense set; 'none': skip)")
    p.add_argument("--widths", type=lambda t: _ints(t, True), default=(None,),
                   help="DEX widths for the DECS on/off sweep, 'inf' = unbounded (default inf)")
    p.add_argument("--no-decs-off", action="store_true", help="skip the DECS-off runs")
    p.add_argument("--policy-explorers", type=_ints, help="uniform N for the admission-policy comparison "
                                                         "(default: the two largest swept N)")
    p.add_argument("--policy-widths", type=_ints, default=(1, 2), help="narrow widths for the policy comparison")
    p.add_argument("--layerskip-g", type=_ints, default=(1, 2, 3, 4, 6, 8), help="LayerSkip draft lengths")
    p.add_argument("--hf-early-exit", type=_ints, help="depths for HF assistant_early_exit (default L/4,L/2,3L/4)")
    p.add_argument("--no-wall-clock", action="store_true", help="skip the HF generate timings")
    p.add_argument("--no-layerskip-check", action="store_true", help="skip running the self-speculative decoder")
    p.add_argument("--max-branches", type=positive_int, default=256, help="DEX expansion budget")
    p.add_argument("--no-lens", action="store_true", help="with --adapters: run the adapter exits only (plus AR)")
    p.add_argument("--replot", nargs="+", metavar="BENCH_JSON",
                   help="re-write bench.md and the plots into --out from these bench.json files (runs merged; "
                        "e.g. a lens run and an adapters run); nothing is decoded")
    p.add_argument("--quick", action="store_true", help="tiny prompt set and few settings (< 1 min on a small model)")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--out", help="output directory (default: results/<model-name>)")
    return p


def bench_config(args, num_layers: int):
    from dex_adapt.bench import BenchConfig, default_nonuniform, divisor_explorers
    from dex_adapt.exploration import ExplorationSet

    extra = None
    if args.exits:
        extra = () if args.exits == ["none"] else tuple(ExplorationSet.parse(e, num_layers).exits for e in args.exits)
    config = BenchConfig(
        max_new_tokens=args.max_new_tokens, explorers=args.explorers, extra_exits=extra, widths=args.widths,
        decs=(True,) if args.no_decs_off else (True, False), policy_explorers=args.policy_explorers,
        policy_widths=args.policy_widths, layerskip_g=args.layerskip_g, hf_early_exit=args.hf_early_exit,
        wall_clock=not args.no_wall_clock, check_layerskip=not args.no_layerskip_check,
        max_branches=args.max_branches, lens=not args.no_lens)
    if args.quick:
        divisors = divisor_explorers(num_layers) or (1,)
        config.max_new_tokens = min(config.max_new_tokens, 12)
        config.explorers = args.explorers or tuple(sorted({divisors[0], divisors[-1]}))
        config.extra_exits = extra if extra is not None else default_nonuniform(num_layers)[:1]
        config.policy_explorers = args.policy_explorers or (config.explorers[-1],)
        config.policy_widths = (1,)
        config.layerskip_g = args.layerskip_g[:2]
        config.hf_early_exit = args.hf_early_exit or tuple(d for d in (num_layers // 2,) if 1 <= d < num_layers)
    for n in (*(config.explorers or ()), *(config.policy_explorers or ())):
        ExplorationSet.uniform(n, num_layers)  # one-line error for an N the model cannot split into
    return config


def replot(args) -> int:
    """Merge the runs of several bench.json files (one model) and re-write the table and plots."""
    import json

    from dex_adapt.report import bench_markdown, plot_bench, plot_ead

    if not args.out:
        raise CliError("--replot needs --out")
    benches = []
    for path in args.replot:
        if not Path(path).is_file():
            raise CliError(f"bench file not found: {path}")
        benches.append(json.loads(Path(path).read_text()))
    merged = {**benches[0], "runs": [], "ead": {}, "sources": list(args.replot)}
    seen = set()
    for bench in benches:
        if bench["model"] != merged["model"] or bench["prompts"] != merged["prompts"]:
            raise CliError(f"--replot files must share the model and prompts ({bench['model']} differs)")
        merged["ead"].update(bench.get("ead", {}))
        for r in bench["runs"]:
            key = json.dumps({k: v for k, v in r.items() if k in ("method", "exits", "width", "decs", "adapters",
                                                                  "k", "g", "policy")}, sort_keys=True)
            if key not in seen:  # AR and HF appear in every file: keep the first
                seen.add(key)
                merged["runs"].append(r)
    out = Path(args.out)
    write_json_atomic(str(out / "bench.json"), merged)
    (out / "bench.md").write_text(bench_markdown(merged))
    plots = plot_bench(merged, out) + plot_ead(merged["ead"], out, title=f"({merged['model']})")
    print(f"wrote {out / 'bench.json'}, {out / 'bench.md'}, " + ", ".join(plots))
    return 0


def run(args) -> int:
    from dex_adapt.bench import run_bench
    from dex_adapt.report import bench_markdown, plot_bench, plot_ead

    model, adapters, path, tokenizer = load_model_and_adapters(args)
    prompts = load_prompt_set(args, tokenizer)
    if args.quick and not (args.humaneval or args.prompt or args.prompts or args.prompt_ids):
        prompts = prompts[:2]
    config = bench_config(args, model.config.num_hidden_layers)
    out = Path(args.out or Path("results") / Path(path).name)
    result = run_bench(model, prompts, config, adapters, progress=not args.no_progress)
    bench = {"model": Path(path).name, "model_path": path, "adapters": args.adapters, **result}
    write_json_atomic(str(out / "bench.json"), bench)
    (out / "bench.md").write_text(bench_markdown(bench))
    plots = plot_bench(bench, out) + plot_ead(result["ead"], out, title=f"({Path(path).name})")
    print(bench_markdown(bench))
    print(f"wrote {out / 'bench.json'}, {out / 'bench.md'}, " + ", ".join(plots))
    bad = [r for r in bench["runs"] if r.get("lossless") is False and r["method"] == "dex"]
    if bad:
        print(f"bench.py: {len(bad)} DEX runs differed from plain AR", file=sys.stderr)
        return 1
    return 0


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    quiet_libraries()
    if args.explorers == ():
        raise SystemExit(f"{build_parser().prog}: error: --explorers is empty")
    return run_with_clean_errors("bench.py", lambda: replot(args) if args.replot else run(args))


if __name__ == "__main__":
    sys.exit(main())
