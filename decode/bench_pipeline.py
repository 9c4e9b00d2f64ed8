"""Wall-clock benchmark of pipelined DEX vs pipelined AR on the same N processes and vs HF generate.

Writes ``<out>/pipeline.json`` (config, the exact commands, machine info, every number; schema in
``dex_adapt/pipeline/bench.py``) and ``pipeline.md`` (the tables), and prints the tables. Pipelined
AR is ``dex-decode --pipeline --max-branches 1`` (a budget of one branch never speculates: every
token traverses all N stages, on the same ranks and protocol as DEX). The measured seconds per tick
are set against the tick model's prediction (one stage forward, timed in this process) and against
an in-process replay that splits each tick into compute, bookkeeping and communication.

Commands::

    # this 2-core CPU machine: the shipped model, N = 2, one thread per process (3-5 min)
    python decode/bench_pipeline.py --model checkpoints/dexcoder-16l --explorers 2 --threads 1 \\
        --num-prompts 5 --max-new-tokens 64
    # the same with trained inducing adapters at the exits
    python decode/bench_pipeline.py --adapters checkpoints/dexcoder-16l-dex --explorers 2 --threads 1
    # one node, one explorer per GPU (NCCL): N = 4 or 8
    python decode/bench_pipeline.py --model /models/Qwen3-32B --explorers 8 --device cuda --dtype bfloat16 \\
        --width 4 --num-prompts 20 --max-new-tokens 128
    # several nodes: print the AR and DEX dex-decode arguments, run each under torchrun on every node
    # (rank 0 writes the JSON), then benchmark from the two records on the node holding rank 0
    python decode/bench_pipeline.py --model /models/Qwen3-32B --explorers 16 --device cuda --dtype bfloat16 \\
        --print-commands
    torchrun --nnodes 2 --nproc-per-node 8 --node-rank $NODE_RANK --rdzv-backend c10d \\
        --rdzv-endpoint $HEAD:29500 -m dex_adapt.cli.decode <AR arguments> --json ar.json
    torchrun ... -m dex_adapt.cli.decode <DEX arguments> --json dex.json
    python decode/bench_pipeline.py --model /models/Qwen3-32B --explorers 16 --device cuda --dtype bfloat16 \\
        --ar-json ar.json --dex-json dex.json
    # CI / a laptop: a tiny model, 2 short prompts, 8 new tokens (~1 min, mostly process start-up)
    python decode/bench_pipeline.py --quick --model /tmp/tiny --out /tmp/bench-pipeline

Bad input exits with status 2 and one line on stderr; outputs that differ between HF generate,
pipelined AR and pipelined DEX exit with status 1 (after writing the results).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable without installing
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dex_adapt.cli.common import (CliError, OneLineParser, default_model_path, positive_int, quiet_libraries,
                                  run_with_clean_errors, write_json_atomic)
from dex_adapt.cli.ead import add_prompt_args, load_prompt_set

QUICK = {"num_prompts": 2, "max_new_tokens": 8, "max_prompt_tokens": 24, "reps": 3}
WARMUP_TOKENS = 8  # the warm-up prompt: the first prompt's first tokens


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser.from_doc("bench_pipeline.py", __doc__)
    p.add_argument("--model", help="base model directory (default: the adapters' base, else the shipped model)")
    p.add_argument("--adapters", help="inducing-adapter checkpoint for the DEX run (default: the logit lens)")
    p.add_argument("--explorers", type=positive_int, default=2, help="N stages = processes (default 2)")
    p.add_argument("--width", type=positive_int, help="DEX: max branches per stage per tick (default unbounded)")
    p.add_argument("--max-branches", type=positive_int, default=256, help="DEX expansion budget (default 256)")
    p.add_argument("--threads", type=positive_int, default=1, help="torch threads per process (default 1)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32")
    add_prompt_args(p, default_count=5)
    p.add_argument("--max-prompt-tokens", type=positive_int, help="keep only the last K tokens of each prompt")
    p.add_argument("--max-new-tokens", type=positive_int, default=64)
    p.add_argument("--reps", type=positive_int, default=20, help="timed repetitions per stage forward (default 20)")
    p.add_argument("--ar-json", help="a dex-decode --json record of the AR run made elsewhere (with --dex-json)")
    p.add_argument("--dex-json", help="a dex-decode --json record of the DEX run made elsewhere (with --ar-json)")
    p.add_argument("--print-commands", action="store_true", help="print the AR and DEX dex-decode commands and exit")
    p.add_argument("--quick", action="store_true",
                   help="2 prompts cut to 24 tokens, 8 new tokens, 3 timing reps (a test on a tiny model)")
    p.add_argument("--out", help="output directory (default: results/<model-name>)")
    return p


def load_prompts(args, path: str, max_positions: int) -> list[list[int]]:
    from dex_adapt.cli.decode import load_tokenizer

    prompts = [ids for _, ids in load_prompt_set(args, load_tokenizer(path))]
    if args.max_prompt_tokens:
        prompts = [ids[-args.max_prompt_tokens:] for ids in prompts]
    for i, ids in enumerate(prompts):
        if len(ids) + args.max_new_tokens > max_positions:
            raise CliError(f"prompt {i} has {len(ids)} tokens: with {args.max_new_tokens} new ones it exceeds the "
                           f"model's context ({max_positions}); use --max-prompt-tokens")
    return prompts


def run(args, argv: list[str]) -> int:
    import torch

    from dex_adapt.model_surgery import load_causal_lm, load_config
    from dex_adapt.pipeline.bench import (PipelineBenchConfig, decode_argv, machine_info, pipeline_markdown,
                                          run_pipeline_bench)

    if args.quick:
        for key, value in QUICK.items():
            if getattr(args, key) == build_parser().get_default(key):
                setattr(args, key, value)
    if bool(args.ar_json) != bool(args.dex_json):
        raise CliError("give both --ar-json and --dex-json, or neither")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise CliError("--device cuda given but no CUDA device is available")
    if args.adapters:
        from dex_adapt.adapters import base_model_path

        path = args.model or base_model_path(args.adapters)
    else:
        path = args.model or str(default_model_path())
    hf_config = load_config(path)
    if hf_config.num_hidden_layers < args.explorers:
        raise CliError(f"{args.explorers} explorers need at least as many layers; the model has "
                       f"{hf_config.num_hidden_layers}")
    prompts = load_prompts(args, path, getattr(hf_config, "max_position_embeddings", 1 << 30))
    warmup = prompts[0][:WARMUP_TOKENS]
    cfg = PipelineBenchConfig(model=path, explorers=args.explorers, width=args.width, max_branches=args.max_branches,
                              adapters=args.adapters, max_new_tokens=args.max_new_tokens, threads=args.threads,
                              device=args.device, dtype=args.dtype, reps=args.reps)
    if args.print_commands:
        for mode in ("ar", "dex"):
            print(shlex.join(["dex-decode", *decode_argv(cfg, [warmup, *prompts], mode)]))
        return 0
    torch.set_num_threads(args.threads)

    def load_model():
        model = load_causal_lm(path, getattr(torch, args.dtype), args.device)
        if not args.adapters:
            return model, None
        from dex_adapt.adapters import load_exit_adapters

        return model, load_exit_adapters(args.adapters, model)

    load_at_start = list(os.getloadavg())
    records = None
    if args.ar_json:
        records = {mode: json.loads(Path(p).read_text()) for mode, p in (("ar", args.ar_json), ("dex", args.dex_json))}
    result = run_pipeline_bench(cfg, prompts, warmup, load_model, records,
                                progress=lambda m: print(f"bench_pipeline: {m}", file=sys.stderr, flush=True))
    name = Path(path).resolve().name
    result = {"model": name, "command": shlex.join(["python", "decode/bench_pipeline.py", *argv]),
              "machine": {**machine_info(args.device), "load_average_at_start": load_at_start}, **result}
    out = Path(args.out or Path("results") / name)
    write_json_atomic(str(out / "pipeline.json"), result)
    markdown = pipeline_markdown(result)
    (out / "pipeline.md").write_text(f"{markdown}\nCommand: `{result['command']}`\n")
    print(markdown)
    print(f"wrote {out / 'pipeline.json'}, {out / 'pipeline.md'}")
    if not result["lossless"]:
        print("bench_pipeline.py: HF generate, pipelined AR and pipelined DEX outputs differ", file=sys.stderr)
        return 1
    return 0


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    quiet_libraries()
    return run_with_clean_errors("bench_pipeline.py", lambda: run(args, argv))


if __name__ == "__main__":
    sys.exit(main())
