"""Tick-model baselines for the same tokens and the same exploration set (DESIGN.md §4).

Every function here is pure: its input is what plain AR decoding recorded, per committed token,
at each exit of an exploration set ``X`` (an :class:`ExitTrace` per prompt), and its output is a
:class:`TickCost`. The DEX number itself is never computed here: it comes from running the decoder.

**Pipeline accounting.** ``N`` explorers, one tick = one stage forward on every explorer. The
branch carrying token ``x_t`` was spawned from exit ``e`` of its parent (the branch carrying
``x_{t-1}``) or started from stage 0 on fallback. Once ``x_t`` is committed, its branch needs
``e + 1`` more ticks to finish the final stage (it ran ``N-1-e`` stages while its parent finished)
and commit ``x_{t+1}``, or ``N`` on fallback. The first token always costs ``N`` (its branch, the
last prompt token, starts at stage 0) and how the last token was spawned costs nothing, so::

    ticks(prompt) = N + sum_{t < T-1} cost(x_t),   cost = e + 1 (spawned from exit e) | N (fallback)

which is exactly what :class:`~dex_adapt.lattice.Lattice` counts with unbounded width
(:func:`replay_lattice` checks it against the real lattice, with no model).

**Stage units.** ``stage_forwards`` counts branch-stage forwards (one token through one stage),
discarded work included; ``ticks`` counts pipeline steps. A batch of branches at one stage in one
tick costs one tick (decode is memory-bound) but one stage-forward per branch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .lattice import Lattice, Proposal

__all__ = [
    "ExitTrace", "TickCost", "pipeline_ticks", "ar_cost", "single_exit_cost", "layerskip_rounds",
    "layerskip_cost", "oracle_cost", "shallowest_match_cost", "shallowest_match_exits", "replay_lattice",
]


@dataclass(frozen=True)
class ExitTrace:
    """One prompt's plain AR decode seen through an exploration set of ``N`` exits."""

    tokens: tuple[int, ...]
    """Committed tokens ``x_0 .. x_{T-1}``."""
    candidates: tuple[tuple[int, ...], ...]
    """``[T][N]``: exit ``i``'s top-1 for ``x_t`` given the true prefix (exit ``N-1`` = reference argmax)."""
    ead_exit: tuple[int, ...]
    """``[T]``: the exit containing ``x_t``'s per-layer EAD (DESIGN.md §2)."""
    max_new_tokens: int
    """The decode's token limit (``T < max_new_tokens`` means it stopped at EOS)."""

    @property
    def num_exits(self) -> int:
        return len(self.candidates[0]) if self.candidates else 0


@dataclass(frozen=True)
class TickCost:
    """A method's cost over a prompt set."""

    ticks: int
    tokens: int
    stage_forwards: int | None  # None where it depends on predictions off the true path

    @property
    def ticks_per_token(self) -> float:
        return self.ticks / self.tokens if self.tokens else 0.0

    @property
    def stage_forwards_per_token(self) -> float | None:
        if self.stage_forwards is None or not self.tokens:
            return None
        return self.stage_forwards / self.tokens

    def speedup(self, num_stages: int) -> float:
        """Versus pipelined AR on the same ``N`` explorers: ``N / ticks_per_token``."""
        tpt = self.ticks_per_token
        return num_stages / tpt if tpt else 0.0

    def __add__(self, other: TickCost) -> TickCost:
        sf = None if self.stage_forwards is None or other.stage_forwards is None else (
            self.stage_forwards + other.stage_forwards)
        return TickCost(self.ticks + other.ticks, self.tokens + other.tokens, sf)


def pipeline_ticks(spawn_exit: Sequence[int | None], num_stages: int) -> int:
    """Ticks to commit ``T`` tokens when ``x_t``'s branch came from exit ``spawn_exit[t]`` (None: fallback)."""
    if not spawn_exit:
        return 0
    return num_stages + sum(num_stages if e is None else e + 1 for e in spawn_exit[:-1])


def _total(costs) -> TickCost:
    total = TickCost(0, 0, 0)
    for c in costs:
        total = total + c
    return total


def ar_cost(traces: Sequence[ExitTrace], num_stages: int) -> TickCost:
    """Pipelined AR: every token traverses all ``N`` stages alone, ``N`` ticks and ``N`` forwards."""
    tokens = sum(len(t.tokens) for t in traces)
    return TickCost(num_stages * tokens, tokens, num_stages * tokens)


def single_exit_cost(traces: Sequence[ExitTrace], k: int) -> TickCost:
    """One child per branch, from exit ``k`` only (the paper's ablation).

    A token costs ``k + 1`` ticks when exit ``k``'s candidate was right and ``N`` otherwise (its
    fallback branch starts at stage 0). Work includes the wrong children and their descendants,
    counted by replaying the real lattice (a wrong branch still spawns a child from exit ``k``).
    """
    total = TickCost(0, 0, 0)
    for trace in traces:
        n = trace.num_exits
        if not 0 <= k < n - 1:
            raise ValueError(f"single-exit k must be a non-final exit index 0..{n - 2}, got {k}")
        spawn = [k if c[k] == x else None for c, x in zip(trace.candidates, trace.tokens)]
        ticks = pipeline_ticks(spawn, n)
        replayed = replay_lattice(trace, allowed_exits={k}, off_path_proposes=True)
        if replayed.ticks != ticks:  # the formula above *is* the lattice's semantics; never diverge silently
            raise AssertionError(f"single-exit formula {ticks} != lattice replay {replayed.ticks} ticks")
        total = total + replayed
    return total


def shallowest_match_exits(trace: ExitTrace) -> list[int | None]:
    """Per token, the shallowest non-final exit whose top-1 equals it (None: only the reference)."""
    out: list[int | None] = []
    for cands, x in zip(trace.candidates, trace.tokens):
        out.append(next((i for i, c in enumerate(cands[:-1]) if c == x), None))
    return out


def shallowest_match_cost(traces: Sequence[ExitTrace]) -> TickCost:
    """What DEX without DECS reaches with unbounded width. Work is unknown (off-path predictions).

    With DECS, DEX can beat this bound: a deeper exit proposes its next-best token when its top-1
    was already proposed, so a token can match at an exit whose *top-1* did not.
    """
    return _total(TickCost(pipeline_ticks(shallowest_match_exits(t), t.num_exits), len(t.tokens), None)
                  for t in traces)


def oracle_cost(traces: Sequence[ExitTrace]) -> TickCost:
    """Per token ``i* + 1`` ticks, ``i*`` the exit containing its EAD; the oracle spawns only the
    right child, so it does no discarded work (``N`` forwards per token)."""
    total = TickCost(0, 0, 0)
    for t in traces:
        n = t.num_exits
        spawn = [e if e < n - 1 else None for e in t.ead_exit]
        total = total + TickCost(pipeline_ticks(spawn, n), len(t.tokens), n * len(t.tokens))
    return total


def layerskip_rounds(matches: Sequence[bool], g: int, limit: int | None = None) -> list[tuple[int, int]]:
    """Draft/verify rounds of greedy self-speculation: ``(drafted, committed)`` per round.

    ``matches[t]``: the draft exit's top-1 for ``x_t`` on the *true* prefix equals ``x_t``;
    ``limit`` is the token budget (``>= len(matches)``; fewer tokens means the decode stopped at
    EOS). A round drafts ``g' = min(g, limit - t - 1)`` tokens (the verify pass supplies one more;
    the decoder cannot know an EOS is coming, only the budget), accepts the longest matching prefix
    ``a`` and commits ``a + 1`` tokens (fewer if EOS ends the decode). Drafts after the first wrong
    one condition on a wrong prefix, but they are never accepted, so true-prefix predictions suffice.
    """
    total = len(matches)
    limit = total if limit is None else limit
    if limit < total:
        raise ValueError(f"limit {limit} is below the number of tokens {total}")
    rounds, t = [], 0
    while t < total:
        drafted = min(g, limit - t - 1)
        accepted = 0
        while accepted < drafted and t + accepted < total and matches[t + accepted]:
            accepted += 1
        committed = min(accepted + 1, total - t)
        rounds.append((drafted, committed))
        t += committed
    return rounds


def layerskip_cost(traces: Sequence[ExitTrace], k: int, g: int) -> TickCost:
    """LayerSkip-style self-speculation: draft ``g`` tokens from exit ``k``, verify with one full pass.

    Stage units on the same ``N`` explorers: drafting is sequential (draft ``j+1`` needs draft
    ``j``'s exit), so ``g`` drafts through stages ``0..k`` cost ``g·(k+1)`` ticks; verification is
    one pass of the ``g+1`` tokens (the last committed token and the drafts) through all ``N``
    stages, ``N`` ticks (its critical path is the last draft, which has run no stage yet). A round
    costs ``g·(k+1) + N`` ticks and commits ``accepted + 1`` tokens. Work, reusing the drafts' KV
    of stages ``0..k`` as LayerSkip does: ``g·(k+1)`` draft forwards + ``g·(N-k-1) + N`` verify
    forwards ``= (g+1)·N`` stage-forwards per round. Pipelined AR is the ``g = 0`` case.
    """
    if g < 1:
        raise ValueError(f"draft length g must be >= 1, got {g}")
    total = TickCost(0, 0, 0)
    for trace in traces:
        n = trace.num_exits
        if not 0 <= k < n - 1:
            raise ValueError(f"layerskip k must be a non-final exit index 0..{n - 2}, got {k}")
        matches = [c[k] == x for c, x in zip(trace.candidates, trace.tokens)]
        rounds = layerskip_rounds(matches, g, trace.max_new_tokens)
        ticks = sum(d * (k + 1) + n for d, _ in rounds)
        work = sum((d + 1) * n for d, _ in rounds)
        total = total + TickCost(ticks, len(trace.tokens), work)
    return total


def replay_lattice(trace: ExitTrace, allowed_exits: set[int] | None = None, width: int | None = None,
                   off_path_proposes: bool = False, policy: str = "fifo") -> TickCost:
    """Drive the real :class:`Lattice` (no DECS) with the recorded predictions, no model involved.

    Branches on the true path propose the recorded top-1 of each allowed exit; branches off it
    propose nothing, or (``off_path_proposes``) a token that never matches — their descendants are
    discarded either way, so with unbounded width the ticks are exact. Off-path predictions are not
    recorded, so with a finite width (contention) or DECS only the real decoder gives the cost.
    """
    n, tokens = trace.num_exits, trace.tokens
    lattice = Lattice(n, width=width, decs=False, policy=policy, max_branches=1 << 20)
    if not tokens:
        return TickCost(0, 0, 0)
    # Positions are token indices: the last prompt token sits at -1, x_t at t (DexDecoder's limit rule).
    lattice.start(position=-1, token=-1, limit_position=trace.max_new_tokens - 1)
    committed = 0
    while committed < len(tokens):
        plan = lattice.plan()
        proposals = {}
        for stage, tasks in enumerate(plan.stages[:-1]):
            for task in tasks:
                branch = lattice.live[task.branch]
                allowed = allowed_exits is None or stage in allowed_exits
                p = branch.position + 1
                if allowed and _on_path(branch, tokens) and p < len(tokens):
                    proposals[task.branch] = Proposal(trace.candidates[p][stage], 1.0)
                elif allowed and off_path_proposes:
                    proposals[task.branch] = Proposal(-2 - task.branch, 0.5)  # unique, never a real token
                else:
                    proposals[task.branch] = Proposal(None, 0.0)
        reference = None
        if plan.stages[-1]:
            reference = tokens[lattice.anchor.position + 1]
        result = lattice.apply(proposals, reference)
        if result.committed_token is not None:
            committed += 1
    s = lattice.stats
    return TickCost(s.ticks, s.committed, s.stage_forwards)


def _on_path(branch, tokens) -> bool:
    node = branch
    while node is not None:
        if node.position >= 0 and (node.position >= len(tokens) or node.token != tokens[node.position]):
            return False
        node = node.parent
    return True
