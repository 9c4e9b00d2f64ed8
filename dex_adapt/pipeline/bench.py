"""Wall-clock benchmark: pipelined DEX vs pipelined AR on the same N processes vs HF ``generate``.

Same prompts, same run (DESIGN.md §4). Pipelined AR is ``dex-decode --pipeline --max-branches 1``:
with a budget of one branch the lattice never speculates, so every token traverses all N stages on
the same ranks, protocol and KV cache (the exit heads are skipped). Both pipelined runs are
subprocesses read back through ``--json``; a short warm-up prompt goes first in every run (first
gloo/NCCL contact, allocator growth) and is left out. Then, with the whole model in this process:

* **tick model** (:func:`time_stages`): one stage forward, as a rank's ``StageRunner`` runs it, at
  the typical context. Per tick, AR costs the mean stage at batch 1 (one stage busy per tick), DEX
  the slowest stage at the typical DEX batch with its exit head (the all_gather waits for it).
* **replay** (:func:`replay`): the single-process executor on the same prompts, every stage forward
  timed. It gives the exact batches, the tick counts (must equal the pipelined ones), the compute of
  a pipelined tick (its slowest stage), the prefill, and the lattice bookkeeping per tick. With
  :func:`time_stages_together` (ranks sharing CPU cores) the rest of the measured tick is
  communication and synchronisation: isend/irecv of hidden states, the all_gather, scheduling.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass

import torch

from ..decoder import DexConfig, DexDecoder
from ..executor import SingleProcessExecutor, StageRunner
from ..exploration import ExplorationSet
from ..lattice import Task
from ..sampling import Sampler, SamplingConfig

__all__ = ["PipelineBenchConfig", "run_pipeline_bench", "decode_argv", "run_decode", "summarise_decode",
           "hf_generate", "time_stages", "time_stages_together", "replay", "tick_model", "machine_info",
           "pipeline_markdown"]


@dataclass
class PipelineBenchConfig:
    """One benchmark setting (both pipelined runs share everything but the branch budget)."""

    model: str
    """Base model directory (each rank reads its own layers from its safetensors)."""
    explorers: int = 2
    """N: stages = processes (= GPUs with ``device='cuda'``)."""
    width: int | None = None
    """DEX: max branches per stage per tick (None: unbounded)."""
    max_branches: int = 256
    """DEX: expansion budget (live branches)."""
    adapters: str | None = None
    """DEX: inducing-adapter checkpoint (None: the logit lens)."""
    max_new_tokens: int = 64
    """New tokens per prompt (fewer at an EOS)."""
    threads: int = 1
    """torch threads in every process, this one included."""
    device: str = "cpu"
    dtype: str = "float32"
    reps: int = 20
    """Timed repetitions per stage forward in the tick model (the median is kept)."""
    fault_timeout: float = 60.0


def decode_argv(cfg: PipelineBenchConfig, prompts: list[list[int]], mode: str) -> list[str]:
    """``dex-decode`` arguments of the ``'ar'`` or ``'dex'`` run (without ``--json``)."""
    argv = ["--model", cfg.model, "--pipeline", "--threads", str(cfg.threads), "--explorers", str(cfg.explorers),
            "--max-new-tokens", str(cfg.max_new_tokens), "--dtype", cfg.dtype, "--device", cfg.device,
            "--fault-timeout", str(cfg.fault_timeout)]
    if mode == "ar":
        argv += ["--max-branches", "1"]
    elif mode == "dex":
        argv += ["--max-branches", str(cfg.max_branches)]
        argv += ["--width", str(cfg.width)] if cfg.width else []
        argv += ["--adapters", cfg.adapters] if cfg.adapters else []
    else:
        raise ValueError(f"mode must be 'ar' or 'dex', got {mode!r}")
    for ids in prompts:
        argv += ["--prompt-ids", ",".join(map(str, ids))]
    return argv


def run_decode(argv: list[str], threads: int, timeout_s: float = 3600) -> dict:
    """Run ``dex-decode`` (its own launcher starts the ranks) and return its ``--json`` record."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "decode.json")
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        result = subprocess.run([sys.executable, "-m", "dex_adapt.cli.decode", *argv, "--json", path], env=env,
                                capture_output=True, text=True, timeout=timeout_s)
        if result.returncode != 0:
            raise RuntimeError(f"dex-decode failed ({result.returncode}): {result.stderr.strip()[-1500:]}")
        with open(path) as f:
            return json.load(f)


def summarise_decode(record: dict, warmup: int = 1) -> dict:
    """Totals over the prompts of a ``dex-decode --json`` record, the first ``warmup`` prompts left out."""
    rows = record["prompts"][warmup:]
    committed, ticks, wall = (sum(r[k] for r in rows) for k in ("committed", "ticks", "wall_s"))
    return {"committed": committed, "ticks": ticks, "wall_s": wall,
            "stage_forwards": sum(r["stage_forwards"] for r in rows),
            "fallbacks": sum(r["fallbacks"] for r in rows),
            "accepted_by_exit": [sum(c) for c in zip(*(r["accepted_by_exit"] for r in rows))],
            "tokens_per_s": committed / wall if wall else 0.0,
            "ticks_per_token": ticks / committed if committed else 0.0,
            "per_tick_s": wall / ticks if ticks else 0.0,
            "outputs": [r["output_ids"] for r in rows]}


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


@torch.no_grad()
def hf_generate(model, prompts: list[list[int]], max_new_tokens: int, warmup: list[int] | None = None) -> dict:
    """Greedy HF ``generate`` per prompt, timed; the warm-up prompt is not counted."""
    device = model.device
    pad = model.generation_config.pad_token_id
    pad = pad if pad is not None else (model.generation_config.eos_token_id or 0)  # silences a warning
    outputs, wall = [], 0.0
    for i, ids in enumerate(([warmup] if warmup else []) + prompts):
        x = torch.tensor([ids], device=device)
        _sync(device)
        t0 = time.perf_counter()
        out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_new_tokens, do_sample=False,
                             pad_token_id=pad[0] if isinstance(pad, list) else pad)
        _sync(device)
        if warmup and i == 0:
            continue
        wall += time.perf_counter() - t0
        outputs.append(out[0, len(ids):].tolist())
    tokens = sum(len(o) for o in outputs)
    return {"committed": tokens, "wall_s": wall, "tokens_per_s": tokens / wall if wall else 0.0, "outputs": outputs}


def _compute_clock(device):
    """Seconds of compute: this thread's CPU time on a CPU (one torch thread: the forward runs in
    it), so that other jobs on a shared machine do not inflate it; synchronised wall time on a GPU."""
    if torch.device(device).type == "cpu":
        return time.thread_time
    return lambda: (_sync(device), time.perf_counter())[1]


@torch.no_grad()
def _stage_seconds(staged, exploration, stage: int, batch: int, context: int, reps: int, head: bool,
                   ready=None) -> tuple[float, float]:
    """Median (compute, wall) seconds of one forward of ``stage`` as its rank runs it: ``batch`` sibling
    branches after ``context`` committed positions, the exit head when ``head`` (the final stage samples)."""
    vocab, device, clock = staged.lm_head.weight.shape[0], staged.device, _compute_clock(staged.device)
    runner = StageRunner(staged, exploration, Sampler(SamplingConfig()))
    runner.prefill([i % vocab for i in range(context)], exploration.stages[stage])
    tasks = tuple(Task(10_000 + j, context, j % vocab, (), (), j == 0, head) for j in range(batch))
    hidden = None if stage == 0 else torch.randn(1, batch, staged.config.hidden_size, dtype=staged.dtype,
                                                 device=device)  # values do not change the cost
    compute, wall = [], []
    for rep in range(reps + 2):  # two untimed warm-ups
        if rep == 2 and ready is not None:
            ready()
        _sync(device)
        c0, w0 = clock(), time.perf_counter()
        runner.run_stage(stage, tasks, hidden)
        c1 = clock()
        compute.append(c1 - c0)
        wall.append(time.perf_counter() - w0)
        runner.cache.release([t.branch for t in tasks])
    return statistics.median(compute[2:]), statistics.median(wall[2:])


def time_stages(staged, exploration, batch: int, context: int, reps: int = 20) -> dict:
    """Per stage, the compute seconds of one forward: ``"ar"`` at batch 1 without exit head, ``"dex"``
    at ``batch`` with it (the final stage only ever runs the anchor: batch 1); ``"wall_over_compute"``:
    how much longer the forwards took on the clock (1.0 on an idle core)."""
    last, out = exploration.num_stages - 1, {}
    for mode in ("ar", "dex"):
        out[mode] = [_stage_seconds(staged, exploration, s, 1 if mode == "ar" or s == last else batch, context,
                                    reps, mode == "dex") for s in range(exploration.num_stages)]
    ratio = statistics.fmean(w / c for c, w in out["ar"] + out["dex"])
    return {"ar": [c for c, _ in out["ar"]], "dex": [c for c, _ in out["dex"]], "wall_over_compute": ratio}


def time_stages_together(staged, exploration, batch: int, context: int, reps: int = 20) -> dict | None:
    """The DEX stage forwards with every rank computing at once, one forked process per stage (CPU
    only): ``{"compute": [s], "wall": [s], "wall_over_compute"}``. With fewer free cores than N the
    ranks share cores; that costs a pipelined DEX tick, not a pipelined AR one (one rank computes)."""
    if staged.device.type != "cpu":
        return None
    n, ctx = exploration.num_stages, multiprocessing.get_context("fork")
    barrier, queue = ctx.Barrier(n), ctx.Queue()

    def work(stage):
        b = 1 if stage == n - 1 else batch
        queue.put((stage, _stage_seconds(staged, exploration, stage, b, context, reps, True, barrier.wait)))

    procs = [ctx.Process(target=work, args=(s,), daemon=True) for s in range(n)]
    for p in procs:
        p.start()
    try:
        seconds = dict(queue.get(timeout=600) for _ in procs)
    finally:
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
    compute, wall = ([seconds[s][i] for s in range(n)] for i in (0, 1))
    ratio = statistics.fmean(w / c for c, w in zip(compute, wall))
    return {"compute": compute, "wall": wall, "wall_over_compute": ratio}


class _TimedExecutor(SingleProcessExecutor):
    """The single-process executor, timing the compute of every stage forward of every tick and the prefill."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.ticks: list[list[tuple[int, int, float]]] = []  # per tick: (stage, batch, seconds)
        self.prefill_s = 0.0
        self.clock = _compute_clock(self.runner.staged.device)
        run = self.runner.run_stage

        def timed(stage, tasks, hidden=None):
            t0 = self.clock()
            out = run(stage, tasks, hidden)
            self.ticks[-1].append((stage, len(tasks), self.clock() - t0))
            return out

        self.runner.run_stage = timed

    def prefill(self, token_ids):
        t0 = self.clock()
        super().prefill(token_ids)
        self.prefill_s += self.clock() - t0

    def run_tick(self, plan):
        self.ticks.append([])
        return super().run_tick(plan)


def replay(staged, config: DexConfig, prompts: list[list[int]], max_new_tokens: int,
           warmup: list[int] | None = None) -> dict:
    """Decode in one process and account for a pipelined tick: its compute is its slowest stage.
    All seconds are compute seconds (see :func:`_compute_clock`)."""
    decoder = DexDecoder(staged, config)
    last, clock = decoder.exploration.num_stages - 1, _compute_clock(staged.device)
    ticks, prefill_s, total, outputs = [], 0.0, 0.0, []
    if warmup:
        decoder.generate(warmup, max_new_tokens)
    for ids in prompts:
        executor = _TimedExecutor(staged, decoder.exploration, Sampler(decoder.sampling))
        t0 = clock()
        outputs.append(decoder.generate(ids, max_new_tokens, executor=executor)[0])
        total += clock() - t0
        ticks += executor.ticks
        prefill_s += executor.prefill_s
    n = len(ticks)
    compute = sum(max(t for _, _, t in tick) for tick in ticks)
    # The batch of the busiest non-final stage, over the ticks where one runs at all.
    busiest = [b for b in (max((b for s, b, _ in tick if s < last), default=0) for tick in ticks) if b] or [1]
    bookkeeping = total - prefill_s - sum(t for tick in ticks for _, _, t in tick)
    return {"ticks": n, "compute_s": total, "prefill_s": prefill_s, "compute_per_tick_s": compute / n,
            "several_stages_fraction": sum(len(tick) > 1 for tick in ticks) / n,
            "bookkeeping_per_tick_s": bookkeeping / n, "mean_batch_busiest_stage": statistics.fmean(busiest),
            "max_batch": max(busiest), "outputs": outputs}


def tick_model(stage_s: dict, together: dict | None, replays: dict, runs: dict, num_prompts: int) -> dict:
    """Predicted vs measured seconds per tick for ``'ar'``/``'dex'``, and where the difference goes.

    Compute, bookkeeping and prefill come from the replay; the rest of a measured tick is
    communication, synchronisation and waiting for a core. The last is estimated apart by scaling the
    compute with the wall/compute ratio of the stage probes: alone (other jobs on the machine) and,
    for the ticks where several ranks compute, together (a snapshot: on a busy machine it is rough)."""
    predicted = {"ar": statistics.fmean(stage_s["ar"]), "dex": max(stage_s["dex"])}
    alone = stage_s["wall_over_compute"]
    out = {}
    for mode in ("ar", "dex"):
        run, rep = runs[mode], replays[mode]
        several = rep["several_stages_fraction"] if together else 0.0
        factor = (1 - several) * alone + several * (together["wall_over_compute"] if together else alone)
        # The pipelined prefill runs the stages one after another: about the single-process prefill.
        prefill = rep["prefill_s"] * alone
        without_prefill = (run["wall_s"] - prefill) / run["ticks"] if run["ticks"] else 0.0
        waiting = rep["compute_per_tick_s"] * max(0.0, factor - 1)
        out[mode] = {"measured_s": run["per_tick_s"], "measured_without_prefill_s": without_prefill,
                     "predicted_s": predicted[mode], "measured_over_predicted": run["per_tick_s"] / predicted[mode],
                     "replay_compute_s": rep["compute_per_tick_s"], "bookkeeping_s": rep["bookkeeping_per_tick_s"],
                     "prefill_per_prompt_s": prefill / num_prompts, "waiting_for_cores_s": waiting,
                     "rest_s": without_prefill - rep["compute_per_tick_s"] - rep["bookkeeping_per_tick_s"]}
    return out


def machine_info(device: str) -> dict:
    info = {"cpu_count": os.cpu_count(), "cpus_usable": len(os.sched_getaffinity(0)),
            "torch_threads": torch.get_num_threads(), "torch": torch.__version__, "python": platform.python_version(),
            "platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "load_average": list(os.getloadavg())}
    if device == "cuda" and torch.cuda.is_available():
        info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return info


def pipeline_markdown(result: dict) -> str:
    """The tables of a ``pipeline.json`` record."""
    c, hf, runs, tm = result["config"], result["hf_generate"], result["runs"], result["tick_model"]
    n = c["explorers"]
    lines = [f"## Pipelined DEX wall clock: {result['model']}, N = {n}, {c['num_prompts']} prompts x "
             f"{c['max_new_tokens']} new tokens, {c['threads']} thread(s)/process, {c['device']}, "
             f"exits: {'adapters ' + c['adapters'] if c['adapters'] else 'logit lens'}", "",
             "| method | tokens | wall s | tokens/s | vs HF | ticks/token | s/tick measured | s/tick predicted "
             "| measured/predicted |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
             f"| HF generate (1 process) | {hf['committed']} | {hf['wall_s']:.2f} | {hf['tokens_per_s']:.1f} | 1.00 "
             "| | | | |"]
    names = {"ar": f"pipelined AR (N={n})", "dex": f"pipelined DEX (N={n}, W={c['width'] or 'inf'})"}
    for mode in ("ar", "dex"):
        r, t = runs[mode], tm[mode]
        lines.append(f"| {names[mode]} | {r['committed']} | {r['wall_s']:.2f} | {r['tokens_per_s']:.1f} | "
                     f"{r['tokens_per_s'] / hf['tokens_per_s']:.2f} | {r['ticks_per_token']:.2f} | "
                     f"{1e3 * t['measured_s']:.2f} ms | {1e3 * t['predicted_s']:.2f} ms | "
                     f"{t['measured_over_predicted']:.1f}x |")
    s = result["speedup"]
    lines += ["", f"DEX / pipelined AR: **{s['dex_vs_ar_pipelined']:.2f}x** tokens/s "
                  f"(tick model: {s['dex_vs_ar_ticks']:.2f}x); DEX / HF generate: **{s['dex_vs_hf']:.2f}x**; "
                  f"lossless (all three outputs equal): {result['lossless']}; replayed tick counts equal: "
                  f"{result['ticks_match']}.", "",
              "| per tick (ms) | AR | DEX |", "|---|---:|---:|"]
    rows = [("measured (wall / ticks)", "measured_s"), ("measured, prefill removed", "measured_without_prefill_s"),
            ("tick model: one stage forward", "predicted_s"), ("replay: slowest stage of the tick", "replay_compute_s"),
            ("replay: lattice + executor bookkeeping", "bookkeeping_s"),
            ("rest: communication, all_gather sync, waiting for a CPU core", "rest_s"),
            ("  of which waiting for a core (estimate from the stage probes)", "waiting_for_cores_s")]
    lines += [f"| {label} | {1e3 * tm['ar'][k]:.2f} | {1e3 * tm['dex'][k]:.2f} |" for label, k in rows]
    st, tog = result["stage_s"], result["stages_together"]
    lines += ["", f"Tick model at context {c['context']} tokens, DEX batch {c['typical_batch']} (mean busiest-stage "
                  f"batch in the replay). Compute per stage forward (ms): AR {_ms(st['ar'])}, DEX {_ms(st['dex'])}; "
                  f"wall/compute {st['wall_over_compute']:.2f} alone"
                  + (f", {tog['wall_over_compute']:.2f} with all ranks computing at once (wall {_ms(tog['wall'])})"
                     if tog else "") + f"; prefill {1e3 * tm['ar']['prefill_per_prompt_s']:.1f} ms per prompt. "
                  "Compute seconds are CPU time of the computing thread (GPU: synchronised wall time).", ""]
    return "\n".join(lines)


def _ms(values) -> str:
    return "[" + ", ".join(f"{1e3 * v:.2f}" for v in values) + "]"


def run_pipeline_bench(cfg: PipelineBenchConfig, prompts: list[list[int]], warmup: list[int], load_model,
                       records: dict | None = None, progress=print) -> dict:
    """The whole benchmark. ``load_model() -> (model, adapters or None)`` gives the full model on
    ``cfg.device``; it is called after the pipelined runs, so they never share a device with it.
    ``records``: ``{"ar"|"dex": dex-decode --json record}`` of runs made elsewhere (e.g. multi-node
    torchrun with the arguments of :func:`decode_argv`), used instead of launching them here."""
    from ..model_surgery import StagedModel

    runs, commands = {}, {}
    for mode in ("ar", "dex"):
        argv = decode_argv(cfg, [warmup, *prompts], mode)
        commands[mode] = shlex.join(["dex-decode", *argv])
        if records and mode in records:
            record = records[mode]
        else:
            progress(f"pipelined {mode.upper()}: launching {cfg.explorers} ranks")
            record = run_decode(argv, cfg.threads)
        if len(record["prompts"]) != len(prompts) + 1:
            raise ValueError(f"the {mode} record has {len(record['prompts'])} prompts; expected the warm-up "
                             f"and {len(prompts)} (run the arguments of decode_argv)")
        runs[mode] = summarise_decode(record, warmup=1)
        runs[mode]["per_prompt"] = [{k: r[k] for k in ("committed", "ticks", "wall_s")} for r in record["prompts"][1:]]
    model, adapters = load_model()
    progress("HF generate")
    hf = hf_generate(model, prompts, cfg.max_new_tokens, warmup)
    staged = StagedModel(model, adapters)
    configs = {"ar": DexConfig(explorers=cfg.explorers, max_branches=1),
               "dex": DexConfig(explorers=cfg.explorers, width=cfg.width, max_branches=cfg.max_branches)}
    progress("replaying both runs in one process")
    replays = {mode: replay(staged, c, prompts, cfg.max_new_tokens, warmup) for mode, c in configs.items()}
    batch = max(1, round(replays["dex"]["mean_batch_busiest_stage"]))
    context = round(statistics.fmean(len(p) for p in prompts) + cfg.max_new_tokens / 2)
    progress(f"timing stage forwards (batch 1 and {batch}, context {context})")
    exploration = ExplorationSet.uniform(cfg.explorers, staged.num_layers)
    stage_s = time_stages(staged, exploration, batch, context, cfg.reps)
    together = time_stages_together(staged, exploration, batch, context, 5 * cfg.reps)
    ar, dex = runs["ar"], runs["dex"]
    lossless = ar["outputs"] == dex["outputs"] == hf["outputs"] == replays["dex"]["outputs"]
    for r in (*runs.values(), hf, *replays.values()):
        del r["outputs"]
    return {
        "config": {**asdict(cfg), "num_prompts": len(prompts), "prompt_tokens": [len(p) for p in prompts],
                   "warmup_prompt_tokens": len(warmup), "context": context, "typical_batch": batch,
                   "exits": list(exploration.exits)},
        "decode_commands": commands, "hf_generate": hf, "runs": runs, "replay": replays, "stage_s": stage_s,
        "stages_together": together, "tick_model": tick_model(stage_s, together, replays, runs, len(prompts)),
        "speedup": {"dex_vs_ar_pipelined": dex["tokens_per_s"] / ar["tokens_per_s"],
                    "dex_vs_hf": dex["tokens_per_s"] / hf["tokens_per_s"],
                    "ar_pipelined_vs_hf": ar["tokens_per_s"] / hf["tokens_per_s"],
                    "dex_vs_ar_ticks": ar["ticks"] / dex["ticks"]},
        "lossless": lossless,
        "ticks_match": replays["ar"]["ticks"] == ar["ticks"] and replays["dex"]["ticks"] == dex["ticks"],
    }
