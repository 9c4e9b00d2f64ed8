"""``dex-decode``: lossless depth-exploration decoding from the command line.

Examples::

    dex-decode --model checkpoints/dexcoder-16l --explorers 4 --prompt 'def add(a, b):' --verify
    dex-decode --adapters checkpoints/dexcoder-16l-dex --exits 4,8,12,16 --humaneval 0,1,2 --json out.json
    dex-decode --model tiny/ --explorers 2 --prompt-ids 1,2,3 --temperature 0.8 --top-p 0.9 --seed 7
    dex-decode --explorers 2 --pipeline --threads 1 --humaneval 0 --json out.json
    torchrun --nproc-per-node 4 -m dex_adapt.cli.decode --explorers 4 --device cuda --humaneval 0

Bad input exits with status 2 and one line on stderr; a ``--verify`` mismatch exits with status 1;
a pipeline rank that dies or hangs makes every rank exit non-zero (3) naming it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from .common import (CliError, OneLineParser, default_model_path, positive_int, quiet_libraries,
                     run_with_clean_errors, write_json_atomic)

__all__ = ["main", "build_parser"]

DTYPES = ("float32", "bfloat16", "float16")


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser.from_doc("dex-decode", __doc__)
    p.add_argument("--model", help="base model directory (default: the adapters' base, else the shipped model)")
    p.add_argument("--adapters", help="inducing-adapter checkpoint (PEFT directory); its base is the default model")
    x = p.add_mutually_exclusive_group()
    x.add_argument("--explorers", type=positive_int, help="N depth stages, split uniformly (default 4)")
    x.add_argument("--exits", help="explicit exit depths, e.g. 4,8,12,16 (the last is the number of layers)")
    p.add_argument("--width", type=positive_int, help="max branches per explorer per tick (default: unbounded)")
    p.add_argument("--no-decs", action="store_true", help="turn off depth-coupled sampling of exit candidates")
    p.add_argument("--policy", choices=("fifo", "confidence"), default="fifo",
                   help="admission order after the anchor when more than --width branches wait: fifo (oldest "
                        "first, default) or confidence (highest path probability first)")
    p.add_argument("--max-branches", type=positive_int, default=256, help="expansion budget: live branches")
    src = p.add_argument_group("prompts (one decode per prompt; repeat --prompt/--prompt-ids)")
    src.add_argument("--prompt", action="append", default=[], help="prompt text")
    src.add_argument("--prompts", help="JSONL file, one object per line with a 'prompt' field")
    src.add_argument("--prompt-ids", action="append", default=[], help="comma-separated token ids")
    src.add_argument("--humaneval", help="HumanEval task indices from the bundled set, e.g. 0,1,2")
    p.add_argument("--max-new-tokens", type=positive_int, default=64)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-k", type=positive_int)
    p.add_argument("--top-p", type=float)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", choices=DTYPES, default="float32")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--verify", action="store_true",
                   help="also decode with plain AR (HF generate when greedy) and fail on any difference")
    p.add_argument("--json", help="write config, per-prompt results and a summary to this file")
    pipe = p.add_argument_group("pipelined decoding (one explorer per process; or launch under torchrun)")
    pipe.add_argument("--pipeline", action="store_true",
                      help="start one local process per explorer (gloo on CPU, NCCL with CUDA)")
    pipe.add_argument("--fault-timeout", type=float, default=60.0,
                      help="seconds before a silent peer counts as failed (default 60)")
    pipe.add_argument("--threads", type=positive_int, help="torch threads per process")
    return p


def read_prompts(args, tokenizer) -> list[tuple[object, list[int]]]:
    """(display prompt, token ids) for every prompt given, in order."""
    texts: list[str] = list(args.prompt)
    if args.prompts:
        texts += read_jsonl_prompts(args.prompts)
    if args.humaneval:
        from ..prompts import humaneval_prompts

        tasks = humaneval_prompts()
        for index in _int_list(args.humaneval, "--humaneval"):
            if not 0 <= index < len(tasks):
                raise CliError(f"--humaneval index {index} out of range 0..{len(tasks) - 1}")
            texts.append(tasks[index]["prompt"])
    prompts: list[tuple[object, list[int]]] = []
    if texts and tokenizer is None:
        raise CliError("the model directory has no tokenizer: use --prompt-ids")
    for text in texts:
        prompts.append((text, tokenizer.encode(text)))
    for ids in args.prompt_ids:
        prompts.append((None, _int_list(ids, "--prompt-ids")))
    if not prompts:
        raise CliError("no prompt given: use --prompt, --prompts, --prompt-ids or --humaneval")
    return prompts


def read_jsonl_prompts(path: str) -> list[str]:
    if not os.path.isfile(path):
        raise CliError(f"prompts file not found: {path}")
    texts = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                raise CliError(f"{path}:{n}: not valid JSON") from None
            if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str):
                raise CliError(f"{path}:{n}: expected an object with a string 'prompt' field")
            texts.append(obj["prompt"])
    return texts


def _int_list(text: str, flag: str) -> list[int]:
    try:
        return [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise CliError(f"{flag} must be comma-separated integers, got {text!r}") from None


def resolve_model(args) -> str:
    if args.model:
        return args.model
    if args.adapters:
        from ..adapters import base_model_path

        return base_model_path(args.adapters)
    return str(default_model_path())


@dataclass
class Job:
    """Everything checked before any weights load (so the pipelined launcher can refuse bad input)."""

    model_path: str
    exploration: object
    config: object  # DexConfig
    sampling: object  # SamplingConfig
    prompts: list
    tokenizer: object


def prepare(args) -> Job:
    import torch

    from ..decoder import DexConfig, check_prompt
    from ..exploration import ExplorationSet
    from ..model_surgery import load_config
    from ..sampling import SamplingConfig

    if args.device == "cuda" and not torch.cuda.is_available():
        raise CliError("--device cuda given but no CUDA device is available")
    if args.adapters and not os.path.isdir(args.adapters):
        raise CliError(f"adapter checkpoint not found: {args.adapters}")
    sampling = SamplingConfig(args.temperature, args.top_k, args.top_p, args.seed)
    model_path = resolve_model(args)
    hf_config = load_config(model_path)
    num_layers = hf_config.num_hidden_layers
    exits = ExplorationSet.parse(args.exits, num_layers).exits if args.exits else None
    config = DexConfig(exits=exits, explorers=args.explorers, width=args.width, decs=not args.no_decs,
                       policy=args.policy, max_branches=args.max_branches)
    exploration = config.exploration(num_layers)
    tokenizer = load_tokenizer(model_path)
    prompts = read_prompts(args, tokenizer)
    for _, ids in prompts:
        check_prompt(ids, getattr(hf_config, "max_position_embeddings", 1 << 30), hf_config.vocab_size)
    return Job(model_path, exploration, config, sampling, prompts, tokenizer)


def run(args) -> int:
    from ..pipeline import from_env
    from ..pipeline.launch import CHILD_ENV, launch_local

    job = prepare(args)
    ctx = from_env()
    if args.pipeline and not ctx.distributed and os.environ.get(CHILD_ENV) is None:
        if job.exploration.num_stages == 1:
            return execute(args, job, None)
        return launch_local(sys.argv[1:] if args.argv is None else args.argv, job.exploration.num_stages,
                            args.fault_timeout, args.threads)
    if ctx.distributed:
        return execute_pipelined(args, job, ctx)
    return execute(args, job, None)


def execute(args, job: Job, ctx) -> int:
    """Single process: the whole model on one device."""
    import torch

    from ..decoder import DexDecoder
    from ..model_surgery import load_causal_lm

    model = load_causal_lm(job.model_path, getattr(torch, args.dtype), args.device)
    adapters = None
    if args.adapters:
        from ..adapters import load_exit_adapters

        adapters = load_exit_adapters(args.adapters, model)
    decoder = DexDecoder(model, job.config, job.sampling, adapters=adapters)
    return decode_prompts(args, job, decoder, lambda: model, None, report=True)


def execute_pipelined(args, job: Job, ctx) -> int:
    """One rank of the pipeline: only this stage's weights; rank 0 reports."""
    import torch

    from ..decoder import DexDecoder
    from ..model_surgery import StagedModel, load_causal_lm
    from ..pipeline import PipelinedExecutor, load_stage_model
    from ..pipeline.dist import Heartbeat, PipelineFault, init, shutdown
    from ..sampling import Sampler

    if ctx.world_size != job.exploration.num_stages:
        raise CliError(f"{job.exploration.num_stages} explorers need {job.exploration.num_stages} ranks, "
                       f"launched with {ctx.world_size}")
    if args.threads:
        torch.set_num_threads(args.threads)
    device = ctx.device if args.device == "cuda" else torch.device("cpu")
    heartbeat = None
    try:
        init(ctx, args.fault_timeout)
        heartbeat = Heartbeat(ctx)
        layers = job.exploration.stages[ctx.rank]
        model = load_stage_model(job.model_path, layers, ctx.rank == 0, getattr(torch, args.dtype), device)
        adapters = None
        if args.adapters:
            from ..adapters import load_exit_adapters

            depth = job.exploration.exits[ctx.rank]
            adapters = {d: m for d, m in load_exit_adapters(args.adapters, model).items() if d == depth}
        decoder = DexDecoder(StagedModel(model, adapters), job.config, job.sampling)
        sampler = Sampler(job.sampling)

        def executor():
            return PipelinedExecutor(decoder.staged, decoder.exploration, sampler, ctx, args.fault_timeout,
                                     heartbeat)

        def full_model():  # only for --verify, after decoding
            return load_causal_lm(job.model_path, getattr(torch, args.dtype), device)

        return decode_prompts(args, job, decoder, full_model, executor, report=ctx.rank == 0)
    except PipelineFault as e:
        print(f"dex-decode: {e}", file=sys.stderr)
        os._exit(3)  # peers may be gone: do not wait in the process-group teardown
    except torch.distributed.DistError as e:
        print(f"dex-decode: rank {ctx.rank}: {str(e).strip().splitlines()[0]}", file=sys.stderr)
        os._exit(3)
    finally:
        if heartbeat is not None:
            heartbeat.stop()
        shutdown()


def decode_prompts(args, job: Job, decoder, full_model, make_executor, report: bool) -> int:
    from tqdm import tqdm

    from ..verify import verify_output

    records, failures = [], []
    verify_model = None
    for shown, ids in tqdm(job.prompts, desc="prompts", disable=len(job.prompts) < 2 or not report,
                           file=sys.stderr):
        output, stats = decoder.generate(ids, args.max_new_tokens,
                                         executor=make_executor() if make_executor else None)
        if not report:
            continue
        verified = None
        if args.verify:
            verify_model = verify_model or full_model()
            mismatch = verify_output(verify_model, ids, output, decoder.max_new_tokens_for(ids, args.max_new_tokens),
                                     job.sampling, decoder.staged.eos_token_ids)
            verified = mismatch is None
            if mismatch:
                failures.append(f"prompt {len(records)}: {mismatch}")
        text = job.tokenizer.decode(output) if job.tokenizer is not None else None
        print(text if text is not None else ",".join(map(str, output)), flush=True)
        records.append({"prompt": shown if shown is not None else ids, "output_ids": output, "text": text,
                        **_stat_fields(stats), "verified": verified})
    if not report:
        return 0
    summary = summarise(records, decoder)
    if args.json:
        write_json_atomic(args.json, {"config": _config_record(args, job.model_path, decoder),
                                      "prompts": records, "summary": summary})
    print(f"dex-decode: {summary_line(summary, len(records), decoder.exploration.num_stages)}", file=sys.stderr)
    for line in failures:
        print(f"dex-decode: verify failed: {line}", file=sys.stderr)
    return 1 if failures else 0


def load_tokenizer(model_path: str):
    from transformers import AutoTokenizer

    if not any((Path(model_path) / f).exists() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        return None
    return AutoTokenizer.from_pretrained(model_path)


def _stat_fields(stats) -> dict:
    return {k: getattr(stats, k) for k in ("committed", "ticks", "ticks_per_token", "speedup_vs_ar",
                                           "accepted_by_exit", "fallbacks", "stage_forwards", "wall_s")}


def summarise(records: list[dict], decoder) -> dict:
    committed = sum(r["committed"] for r in records)
    ticks = sum(r["ticks"] for r in records)
    tpt = ticks / committed if committed else 0.0
    verified = [r["verified"] for r in records]
    return {
        "committed": committed, "ticks": ticks, "ticks_per_token": tpt,
        "speedup_vs_ar": decoder.exploration.num_stages / tpt if tpt else 0.0,
        "accepted_by_exit": [sum(col) for col in zip(*(r["accepted_by_exit"] for r in records))],
        "fallbacks": sum(r["fallbacks"] for r in records),
        "stage_forwards": sum(r["stage_forwards"] for r in records),
        "wall_s": sum(r["wall_s"] for r in records),
        "verified": None if None in verified else all(verified),
    }


def summary_line(summary: dict, n_prompts: int, explorers: int) -> str:
    """One line for stderr after a decode: what the tick model counted and what --verify found."""
    verified = {None: "not verified (add --verify to compare with plain AR decoding)",
                True: "verified: identical to plain AR decoding",
                False: "NOT identical to plain AR decoding"}[summary["verified"]]
    return (f"{n_prompts} prompt{'s' if n_prompts != 1 else ''}, {summary['committed']} tokens in "
            f"{summary['ticks']} ticks ({summary['ticks_per_token']:.2f} ticks/token; pipelined AR needs "
            f"{explorers}: tick-model speedup {summary['speedup_vs_ar']:.2f}x), kept children by exit "
            f"{summary['accepted_by_exit']}, {summary['fallbacks']} fallbacks; {verified}")


def _config_record(args, model_path: str, decoder) -> dict:
    c, s = decoder.config, decoder.sampling
    return {"model": model_path, "adapters": args.adapters, "exits": list(decoder.exploration.exits),
            "explorers": decoder.exploration.num_stages, "width": c.width, "decs": c.decs, "policy": c.policy,
            "max_branches": c.max_branches, "max_new_tokens": args.max_new_tokens, "temperature": s.temperature,
            "top_k": s.top_k, "top_p": s.top_p, "seed": s.seed, "dtype": args.dtype, "device": args.device}


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = argv
    quiet_libraries()

    return run_with_clean_errors("dex-decode", lambda: run(args))


if __name__ == "__main__":
    sys.exit(main())
