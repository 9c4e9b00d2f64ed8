"""The benchmark: DEX against depth selection, the oracle and HF, on one prompt set (DESIGN.md §4).

One plain greedy AR pass per prompt records every depth's top-1 (``ead.record_traces``); every
tick-model baseline is a pure function of that record (``baselines``). DEX numbers come from running
:class:`~dex_adapt.decoder.DexDecoder` on the same prompts, and each DEX output is checked against
the recorded AR tokens. LayerSkip-style costs are checked by actually running the self-speculative
decoder for the best ``(k, g)`` of each exploration set. Wall-clock (tokens/s) of HF ``generate``,
HF ``generate(assistant_early_exit=k)`` and the single-process DEX executor come from the same run.

Every run is one record with the fields of :data:`RUN_FIELDS` (None where a field does not apply)
plus a few extras (``policy``, ``exit_depth``, ``best``, ``tokens``, ``ticks``, ``headroom_realised``,
``lossless``, ``max_live_branches``). ``k`` is an exit index of the exploration set for
``single_exit``/``layerskip`` and a layer depth for ``hf_early_exit`` (``exit_depth`` always holds the
depth). ``speedup_vs_ar`` is ``N / ticks_per_token`` for tick-model methods and the tokens/s ratio
to ``hf_generate`` for the two HF methods.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass

import torch

from . import baselines as B
from .ead import PromptTrace, ead_summary, exit_trace, record_traces
from .exploration import ExplorationSet
from .lattice import POLICIES

__all__ = ["BenchConfig", "RUN_FIELDS", "METHODS", "run_bench", "divisor_explorers", "default_nonuniform",
           "exploration_sets"]

RUN_FIELDS = ("method", "explorers", "exits", "width", "decs", "adapters", "k", "g", "ticks_per_token",
              "speedup_vs_ar", "stage_forwards_per_token", "tokens_per_s")
METHODS = ("ar", "dex", "single_exit", "layerskip", "oracle", "shallowest_match", "hf_generate", "hf_early_exit")


@dataclass
class BenchConfig:
    """What to sweep. ``None`` fields take defaults derived from the model's depth ``L``."""

    max_new_tokens: int = 64
    """New tokens per prompt (fewer when the model emits EOS)."""
    explorers: tuple[int, ...] | None = None
    """Uniform splits to run (default: every divisor N >= 2 of L)."""
    extra_exits: tuple[tuple[int, ...], ...] | None = None
    """Non-uniform exploration sets (default: :func:`default_nonuniform`)."""
    widths: tuple[int | None, ...] = (None,)
    """DEX widths for the DECS on/off sweep (None: unbounded)."""
    decs: tuple[bool, ...] = (True, False)
    """DECS settings for the width sweep."""
    policy_explorers: tuple[int, ...] | None = None
    """Uniform N where the admission policies are compared (default: the two largest swept N)."""
    policy_widths: tuple[int, ...] = (1, 2)
    """Widths below what the lattice wants, for the admission-policy comparison (DECS on)."""
    policies: tuple[str, ...] = POLICIES
    """Admission policies to compare."""
    layerskip_g: tuple[int, ...] = (1, 2, 3, 4, 6, 8)
    """Draft lengths of the LayerSkip-style grid (k runs over every non-final exit)."""
    hf_early_exit: tuple[int, ...] | None = None
    """Layer depths for HF ``assistant_early_exit`` (default: L/4, L/2, 3L/4)."""
    wall_clock: bool = True
    """Time HF generate and HF early exit."""
    check_layerskip: bool = True
    """Run the self-speculative decoder for each set's best (k, g) and check the pure cost."""
    max_branches: int = 256
    """DEX expansion budget (live branches)."""
    lens: bool = True
    """Run the logit-lens exits (False with adapters: the adapter runs only, plus AR)."""


def divisor_explorers(num_layers: int) -> tuple[int, ...]:
    """Every N >= 2 that splits the layers into equal stages."""
    return tuple(n for n in range(2, num_layers + 1) if num_layers % n == 0)


def default_nonuniform(num_layers: int) -> tuple[tuple[int, ...], ...]:
    """A late-dense and an early-dense set of four exits (e.g. 8,12,14,16 and 2,4,8,16 for L=16)."""
    L, sets = num_layers, []
    for fractions in ((1 / 2, 3 / 4, 7 / 8), (1 / 8, 1 / 4, 1 / 2)):
        exits = tuple(sorted({min(L - 1, max(1, round(L * f))) for f in fractions} | {L}))
        if len(exits) > 1 and exits not in sets and exits != ExplorationSet.uniform(len(exits), L).exits:
            sets.append(exits)
    return tuple(sets)


def exploration_sets(config: BenchConfig, num_layers: int) -> list[ExplorationSet]:
    explorers = config.explorers if config.explorers is not None else divisor_explorers(num_layers)
    extra = config.extra_exits if config.extra_exits is not None else default_nonuniform(num_layers)
    sets = [ExplorationSet.uniform(n, num_layers) for n in explorers]
    sets += [ExplorationSet(tuple(e), num_layers) for e in extra]
    unique = {x.exits: x for x in sets}
    return sorted(unique.values(), key=lambda x: (x.num_stages, x.exits))


def _record(method: str, exploration: ExplorationSet | None = None, adapters: bool = False, **fields) -> dict:
    rec = dict.fromkeys(RUN_FIELDS)
    rec.update(method=method, adapters=adapters)
    if exploration is not None:
        rec.update(explorers=exploration.num_stages, exits=list(exploration.exits))
    rec.update(fields)
    return rec


def _cost_fields(cost: B.TickCost, n: int) -> dict:
    return {"ticks_per_token": cost.ticks_per_token, "speedup_vs_ar": cost.speedup(n),
            "stage_forwards_per_token": cost.stage_forwards_per_token, "tokens": cost.tokens, "ticks": cost.ticks}


class _Progress:
    def __init__(self, total: int, enabled: bool) -> None:
        from tqdm import tqdm

        self.bar = tqdm(total=total, desc="bench", unit="decode", disable=not enabled, dynamic_ncols=True)

    def step(self, label: str) -> None:
        self.bar.set_postfix_str(label, refresh=False)
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()


def run_bench(model, prompts: list[tuple[str, list[int]]], config: BenchConfig, adapters=None,
              progress: bool = True) -> dict:
    """Everything for one model and prompt set; returns the ``bench.json`` object (less ``model``)."""
    L = model.config.num_hidden_layers
    sets = exploration_sets(config, L)
    modes = ([False] if config.lens or not adapters else []) + ([True] if adapters else [])
    policy_n = config.policy_explorers
    if policy_n is None:
        policy_n = tuple(sorted({x.num_stages for x in sets if x.exits == ExplorationSet.uniform(x.num_stages, L).exits}))[-2:]
    policy_sets = [ExplorationSet.uniform(n, L) for n in policy_n]
    hf_depths = config.hf_early_exit if config.hf_early_exit is not None else tuple(
        sorted({d for d in (L // 4, L // 2, 3 * L // 4) if 1 <= d < L}))
    dex_settings = [(w, d, None if w is None else "confidence") for w in config.widths for d in config.decs]
    policy_settings = [(w, True, p) for w in config.policy_widths for p in config.policies]
    ids = [p for _, p in prompts]
    P = len(ids)
    units = P * (len(modes) * (len(sets) * len(dex_settings) + len(policy_sets) * len(policy_settings)) + 1)
    units += P * len(modes) * len(sets) * config.check_layerskip
    units += P * (1 + len(hf_depths)) * config.wall_clock
    bar = _Progress(units, progress)

    traces = record_traces(model, ids, config.max_new_tokens, adapters, progress=bar.bar)
    runs: list[dict] = []
    spec_cache: dict = {}
    for mode in modes:
        for x in sets:
            runs += _tick_baselines(traces, x, mode, config.layerskip_g, lens=False in modes)
            if config.check_layerskip:
                _check_best_layerskip(model, traces, x, mode, adapters, runs, spec_cache, bar)
            for width, decs, policy in dex_settings:
                runs.append(_dex_run(model, traces, x, mode, adapters, width, decs, policy, config, bar))
        for x in policy_sets:
            for width, decs, policy in policy_settings:
                runs.append(_dex_run(model, traces, x, mode, adapters, width, decs, policy, config, bar))
    _fill_headroom(runs)
    if config.wall_clock:
        runs += _wall_clock(model, traces, hf_depths, bar)
    bar.close()
    return {
        "prompts": [{"name": name, "prompt_tokens": len(p), "new_tokens": len(t.tokens)}
                    for (name, p), t in zip(prompts, traces)],
        "settings": {"max_new_tokens": config.max_new_tokens, "num_layers": L, "threads": torch.get_num_threads(),
                     "device": str(model.device), "dtype": str(model.dtype).replace("torch.", ""),
                     "max_branches": config.max_branches},
        "ead": {("adapters" if m else "lens"): ead_summary(traces, m) for m in sorted({False, *modes})},
        "runs": runs,
    }


# ------------------------------------------------------------------ tick-model baselines
def _tick_baselines(traces: list[PromptTrace], x: ExplorationSet, adapters: bool, gs,
                    lens: bool = True) -> list[dict]:
    """AR (once per set: it does not depend on the exits), oracle, bound, single exit, LayerSkip."""
    n, ets = x.num_stages, [exit_trace(t, x, adapters) for t in traces]
    runs = []
    if not adapters or not lens:
        runs.append(_record("ar", x, False, **_cost_fields(B.ar_cost(ets, n), n)))
    runs.append(_record("oracle", x, adapters, **_cost_fields(B.oracle_cost(ets), n)))
    runs.append(_record("shallowest_match", x, adapters, **_cost_fields(B.shallowest_match_cost(ets), n)))
    single = [_record("single_exit", x, adapters, k=k, exit_depth=x.exits[k], best=False,
                      **_cost_fields(B.single_exit_cost(ets, k), n)) for k in range(n - 1)]
    skip = [_record("layerskip", x, adapters, k=k, g=g, exit_depth=x.exits[k], best=False,
                    **_cost_fields(B.layerskip_cost(ets, k, g), n)) for k in range(n - 1) for g in gs]
    for family in (single, skip):
        if family:
            min(family, key=lambda r: (r["ticks_per_token"], r["k"], r["g"] or 0))["best"] = True
    return runs + single + skip


def _check_best_layerskip(model, traces, x, adapters, adapter_modules, runs, cache, bar) -> None:
    """Run the self-speculative decoder for this set's best (k, g); the pure cost must match."""
    from .self_spec import self_speculative_decode

    best = next((r for r in runs if r["method"] == "layerskip" and r["best"] and r["exits"] == list(x.exits)
                 and r["adapters"] == adapters), None)
    if best is None:
        for _ in traces:
            bar.step("layerskip check")
        return
    depth, g = best["exit_depth"], best["g"]
    key = (depth, g, adapters)
    if key not in cache:
        adapter = adapter_modules.get(depth) if adapters and adapter_modules else None
        results = []
        for t in traces:
            results.append(self_speculative_decode(model, t.prompt_ids, depth, g, t.max_new_tokens, adapter,
                                                   _eos(model)))
            bar.step(f"layerskip d={depth} g={g}")
        cache[key] = results
    else:
        for _ in traces:
            bar.step("layerskip check (cached)")
    results = cache[key]
    tokens = sum(len(r.tokens) for r in results)
    lossless = all(r.tokens == t.tokens for r, t in zip(results, traces))
    agrees = lossless and all(
        r.rounds == B.layerskip_rounds([row[depth - 1] == tok for row, tok in zip(t.table(adapters), t.tokens)],
                                       g, t.max_new_tokens)
        for r, t in zip(results, traces))
    best.update(lossless=lossless, checked=agrees,
                tokens_per_s=tokens / max(sum(r.wall_s for r in results), 1e-9))


# ------------------------------------------------------------------ DEX, actually run
def _dex_run(model, traces, x, adapters, adapter_modules, width, decs, policy, config, bar) -> dict:
    from .decoder import DexConfig, DexDecoder

    cfg = DexConfig(exits=x.exits, width=width, decs=decs, policy=policy or DexConfig.policy,
                    max_branches=config.max_branches)
    decoder = DexDecoder(model, cfg, adapters=adapter_modules if adapters else None)
    ticks = committed = forwards = max_live = 0
    wall, lossless = 0.0, True
    for t in traces:
        output, stats = decoder.generate(t.prompt_ids, t.max_new_tokens)
        lossless &= output == t.tokens
        ticks += stats.ticks
        committed += stats.committed
        forwards += stats.stage_forwards
        wall += stats.wall_s
        max_live = max(max_live, stats.max_live_branches)
        bar.step(f"dex {x} W={width} decs={int(decs)}")
    n = x.num_stages
    cost = B.TickCost(ticks, committed, forwards)
    return _record("dex", x, adapters, width=width, decs=decs, policy=policy, lossless=lossless,
                   max_live_branches=max_live, tokens_per_s=committed / max(wall, 1e-9), **_cost_fields(cost, n))


def _fill_headroom(runs: list[dict]) -> None:
    """Headroom realised = (AR - DEX) / (AR - oracle), in ticks per token, at the same X."""
    oracle = {(tuple(r["exits"]), r["adapters"]): r["ticks_per_token"] for r in runs if r["method"] == "oracle"}
    for r in runs:
        if r["method"] != "dex":
            continue
        n, best = r["explorers"], oracle.get((tuple(r["exits"]), r["adapters"]))
        if best is not None and n - best > 1e-12:
            r["headroom_realised"] = (n - r["ticks_per_token"]) / (n - best)
        else:
            r["headroom_realised"] = None


# ------------------------------------------------------------------ wall clock
def _eos(model) -> set[int]:
    from .model_surgery import StagedModel

    return StagedModel(model).eos_token_ids


@torch.no_grad()
def _hf_generate(model, prompt_ids: list[int], max_new: int, eos: set[int], early_exit: int | None):
    from transformers import GenerationConfig

    eos_list = sorted(eos) or None
    gen = GenerationConfig(do_sample=False, max_new_tokens=max_new, eos_token_id=eos_list,
                           pad_token_id=eos_list[0] if eos_list else 0, assistant_early_exit=early_exit)
    inputs = torch.tensor([prompt_ids], device=model.device)
    return model.generate(inputs, attention_mask=torch.ones_like(inputs), generation_config=gen)[0, len(prompt_ids):].tolist()


def _wall_clock(model, traces, depths, bar) -> list[dict]:
    """HF greedy and HF early-exit self-speculation, tokens/s over the same prompts."""
    eos = _eos(model)
    _hf_generate(model, traces[0].prompt_ids, 2, eos, None)  # warm-up: first-call allocations
    saved = copy.deepcopy(model.generation_config)  # HF's heuristic schedule mutates the assistant's config
    results = {}
    for depth in (None, *depths):
        tokens, wall, lossless = 0, 0.0, True
        for t in traces:
            model.generation_config = copy.deepcopy(saved)
            t0 = time.perf_counter()
            out = _hf_generate(model, t.prompt_ids, t.max_new_tokens, eos, depth)
            wall += time.perf_counter() - t0
            lossless &= out == t.tokens
            tokens += len(out)
            bar.step("hf generate" if depth is None else f"hf early exit {depth}")
        results[depth] = (tokens / max(wall, 1e-9), lossless)
    model.generation_config = saved
    base = results[None][0]
    runs = [_record("hf_generate", tokens_per_s=base, speedup_vs_ar=1.0, lossless=results[None][1])]
    early = [_record("hf_early_exit", k=d, exit_depth=d, tokens_per_s=tps, speedup_vs_ar=tps / base if base else None,
                     lossless=ok, best=False) for d, (tps, ok) in results.items() if d is not None]
    if early:
        max(early, key=lambda r: r["tokens_per_s"])["best"] = True
    return runs + early
