"""Earliest available depth (EAD): what every exit would have proposed during plain AR decoding.

:func:`record_traces` decodes greedily with the model's own forward and KV cache and records, per
committed token, the top-1 of the exit at *every* depth ``d = 1..L`` on the true prefix
(``StagedModel.exit_logits`` on HF's ``output_hidden_states[d]``, the residual stream before the
final norm; depth ``L`` is the model's own logits). With adapters a second table is recorded from
the same forward: a depth with an adapter exits through it, a depth without one through the logit
lens — exactly what :class:`~dex_adapt.model_surgery.StagedModel` does inside the decoder.

EAD (DESIGN.md §2) of a committed token: the shallowest depth whose prediction equals the token
and stays equal at every deeper depth, measured per layer; :func:`exit_trace` maps it onto an
exploration set ``X`` (the exit containing it) for the tick-model baselines.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from .baselines import ExitTrace, shallowest_match_exits
from .exploration import ExplorationSet

__all__ = ["PromptTrace", "record_traces", "ead_depth", "exit_of_depth", "exit_trace", "ead_summary",
           "exit_summary"]


@dataclass
class PromptTrace:
    """One prompt's greedy AR decode with every depth's top-1 per committed token."""

    prompt_ids: list[int]
    tokens: list[int]
    """Committed tokens ``x_0 .. x_{T-1}`` (greedy)."""
    lens: list[list[int]]
    """``[T][L]``: logit-lens top-1 at depth ``d`` (index ``d-1``); the last column is the model's own."""
    adapted: list[list[int]] | None
    """Same through the adapters where a depth has one (None: no adapters given)."""
    max_new_tokens: int
    """The token budget (``len(tokens) < max_new_tokens`` means the decode stopped at EOS)."""

    def table(self, adapters: bool) -> list[list[int]]:
        if adapters and self.adapted is None:
            raise ValueError("this trace was recorded without adapters")
        return self.adapted if adapters else self.lens

    def to_dict(self) -> dict:
        return {"prompt_ids": self.prompt_ids, "tokens": self.tokens, "lens": self.lens,
                "adapted": self.adapted, "max_new_tokens": self.max_new_tokens}


@torch.no_grad()
def record_traces(model, prompts: Sequence[list[int]], max_new_tokens: int,
                  adapters: Mapping[int, torch.nn.Module] | None = None, eos_token_ids: set[int] | None = None,
                  progress=None) -> list[PromptTrace]:
    """Greedy AR over each prompt, recording every depth's top-1 (lens, and adapters if given)."""
    from .model_surgery import StagedModel

    lens = StagedModel(model)
    adapted = StagedModel(model, adapters) if adapters else None
    eos = lens.eos_token_ids if eos_token_ids is None else eos_token_ids
    traces = []
    for ids in prompts:
        traces.append(_record_one(model, lens, adapted, list(ids), max_new_tokens, eos))
        if progress is not None:
            progress.update(1)
    return traces


def _record_one(model, lens, adapted, prompt_ids, max_new_tokens, eos) -> PromptTrace:
    device, L = model.device, model.config.num_hidden_layers
    # The effective budget, as DexDecoder.max_new_tokens_for computes it (never past the context).
    budget = max(0, min(max_new_tokens, lens.max_positions - len(prompt_ids)))
    trace = PromptTrace(prompt_ids, [], [], [] if adapted is not None else None, budget)
    inputs = torch.tensor([prompt_ids], device=device)
    cache = None
    while len(trace.tokens) < budget:
        out = model(input_ids=inputs, cache=cache, use_cache=True, output_hidden_states=True)
        cache = out.cache
        final = out.logits[0, -1].float()
        token = int(torch.argmax(final))
        hidden = [out.hidden_states[d][0, -1] for d in range(1, L)]  # h_1 .. h_{L-1}, pre-norm
        trace.lens.append(_top1(lens, hidden, token))
        if adapted is not None:
            trace.adapted.append(_top1(adapted, hidden, token))
        trace.tokens.append(token)
        if token in eos:
            break
        inputs = torch.tensor([[token]], device=device)
    return trace


def _top1(staged, hidden: list[torch.Tensor], final_token: int) -> list[int]:
    row = [int(torch.argmax(staged.exit_logits(h, d))) for d, h in enumerate(hidden, start=1)]
    return row + [final_token]


# ------------------------------------------------------------------ pure definitions
def ead_depth(row: Sequence[int], token: int) -> int:
    """Shallowest depth ``e`` (1..L) with ``row[d-1] == token`` for every ``d >= e``.

    ``row`` is one token's top-1 at depths ``1..L``. Under greedy decoding ``row[L-1] == token``;
    if not (sampling), the EAD is ``L``: only the final distribution produced the token.
    """
    depth = len(row)
    if row[-1] != token:
        return depth
    while depth > 1 and row[depth - 2] == token:
        depth -= 1
    return depth


def exit_of_depth(depth: int, exits: Sequence[int]) -> int:
    """The exit whose stage contains ``depth``: the first ``i`` with ``exits[i] >= depth``."""
    for i, d in enumerate(exits):
        if d >= depth:
            return i
    raise ValueError(f"depth {depth} is deeper than the last exit {exits[-1]}")


def exit_trace(trace: PromptTrace, exploration: ExplorationSet, adapters: bool = False) -> ExitTrace:
    """``trace`` seen through ``X``: per token the candidates at each exit and the EAD's exit."""
    table, exits = trace.table(adapters), exploration.exits
    candidates = tuple(tuple(row[d - 1] for d in exits) for row in table)
    ead = tuple(exit_of_depth(ead_depth(row, x), exits) for row, x in zip(table, trace.tokens))
    return ExitTrace(tuple(trace.tokens), candidates, ead, trace.max_new_tokens)


def ead_summary(traces: Sequence[PromptTrace], adapters: bool = False) -> dict:
    """EAD histogram (depths 1..L), mean, and per-depth top-1 agreement with the committed token."""
    rows = [(row, x) for t in traces for row, x in zip(t.table(adapters), t.tokens)]
    if not rows:
        return {"tokens": 0, "ead_histogram": [], "mean_ead": None, "agreement": []}
    L = len(rows[0][0])
    hist = [0] * L
    agree = [0] * L
    for row, x in rows:
        hist[ead_depth(row, x) - 1] += 1
        for d in range(L):
            agree[d] += row[d] == x
    n = len(rows)
    eads = sorted(d for d, c in enumerate(hist, start=1) for _ in range(c))
    return {
        "tokens": n,
        "depths": list(range(1, L + 1)),
        "ead_histogram": hist,
        "mean_ead": sum(eads) / n,
        "median_ead": eads[n // 2],
        "agreement": [a / n for a in agree],
    }


def exit_summary(traces: Sequence[PromptTrace], exploration: ExplorationSet, adapters: bool = False) -> dict:
    """Per exit of ``X``: how many tokens the oracle takes there, and where the shallowest match is."""
    n = exploration.num_stages
    oracle, shallowest = [0] * n, [0] * n
    for t in traces:
        et = exit_trace(t, exploration, adapters)
        for e in et.ead_exit:
            oracle[e] += 1
        for e in shallowest_match_exits(et):
            shallowest[n - 1 if e is None else e] += 1
    return {"exits": list(exploration.exits), "oracle_exit_histogram": oracle,
            "shallowest_match_histogram": shallowest}
