"""Tick-model baselines on hand-made prediction tables: exact costs, and the real lattice agrees."""

from __future__ import annotations

import random

import pytest

from dex_adapt import baselines as B
from dex_adapt.baselines import ExitTrace, TickCost

# N = 3 exits; tokens x_0..x_4 = 10..14. Row t: exit 0, exit 1, exit 2 (= the reference) top-1 for x_t.
TOKENS = (10, 11, 12, 13, 14)
CANDIDATES = (
    (10, 10, 10),  # exit 0 right
    (9, 11, 11),   # exit 1 right
    (9, 8, 12),    # only the reference
    (13, 7, 13),   # exit 0 right, exit 1 wrong (a transient match)
    (14, 14, 14),  # exit 0 right (how the last token was spawned costs nothing)
)
EAD_EXIT = (0, 1, 2, 2, 0)  # x_3's EAD lies past exit 1, which disagrees
TRACE = ExitTrace(TOKENS, CANDIDATES, EAD_EXIT, max_new_tokens=5)


def test_pipeline_ticks_definition():
    assert B.pipeline_ticks([], 4) == 0
    assert B.pipeline_ticks([None], 4) == 4  # the first token: its branch starts at stage 0
    assert B.pipeline_ticks([0, None, 2], 4) == 4 + 1 + 4  # the last token's spawn never matters
    assert B.pipeline_ticks([2, 2, 2, 2], 4) == 4 + 3 * 3


def test_ar_cost():
    cost = B.ar_cost([TRACE], 3)
    assert (cost.ticks, cost.tokens, cost.stage_forwards) == (15, 5, 15)
    assert cost.ticks_per_token == 3.0 and cost.speedup(3) == 1.0


def test_shallowest_match_and_oracle():
    assert B.shallowest_match_exits(TRACE) == [0, 1, None, 0, 0]
    sm = B.shallowest_match_cost([TRACE])
    assert (sm.ticks, sm.tokens, sm.stage_forwards) == (3 + 1 + 2 + 3 + 1, 5, None)
    oracle = B.oracle_cost([TRACE])  # spawns [0, 1, -, -, 0]: x_3's EAD is at the reference
    assert (oracle.ticks, oracle.stage_forwards) == (3 + 1 + 2 + 3 + 3, 15)
    assert sm.stage_forwards_per_token is None


def test_single_exit_costs():
    # k = 0: x_0, x_3, x_4 right -> spawn [0, -, -, 0, 0]
    assert B.single_exit_cost([TRACE], 0).ticks == 3 + 1 + 3 + 3 + 1
    # k = 1: x_0, x_1, x_4 right -> spawn [1, 1, -, -, 1]
    assert B.single_exit_cost([TRACE], 1).ticks == 3 + 2 + 2 + 3 + 3
    with pytest.raises(ValueError):
        B.single_exit_cost([TRACE], 2)  # the reference is not a speculative exit


def test_single_exit_work_counts_wrong_children():
    """N = 2, k = 0, three tokens. All right: no waste, N·T forwards. All wrong: each anchor's wrong
    child runs one stage beside it before the collapse discards it (none at the budget's end)."""
    right = ExitTrace((1, 2, 3), ((1, 1), (2, 2), (3, 3)), (0, 0, 0), 3)
    wrong = ExitTrace((1, 2, 3), ((9, 1), (9, 2), (9, 3)), (1, 1, 1), 3)
    assert B.single_exit_cost([right], 0) == TickCost(2 + 1 + 1, 3, 6)
    assert B.single_exit_cost([wrong], 0) == TickCost(6, 3, 3 + 3 + 2)


def test_layerskip_rounds_and_cost():
    # exit 0 matches [T, F, F, T, T]; g = 2, budget 5
    matches = [c[0] == x for c, x in zip(CANDIDATES, TOKENS)]
    rounds = B.layerskip_rounds(matches, 2, 5)
    # t=0: draft 2, accept 1 (+1) -> 2 tokens; t=2: draft 2, accept 0 -> 1; t=3: draft 1 (budget), accept 1 -> 2
    assert rounds == [(2, 2), (2, 1), (1, 2)]
    cost = B.layerskip_cost([TRACE], 0, 2)
    assert cost.ticks == (2 * 1 + 3) + (2 * 1 + 3) + (1 * 1 + 3)
    assert cost.stage_forwards == (3 + 3 + 2) * 3  # (g'+1)·N per round
    assert cost.tokens == 5
    # k = 1, g = 1: drafts from exit 1 cost 2 ticks each
    assert B.layerskip_cost([TRACE], 1, 1).ticks == sum(d * 2 + 3 for d, _ in B.layerskip_rounds(
        [c[1] == x for c, x in zip(CANDIDATES, TOKENS)], 1, 5))


def test_layerskip_rounds_at_eos_and_budget():
    # EOS ends the decode at 3 tokens although the budget is 10: the decoder still drafted g
    assert B.layerskip_rounds([True, True, True], 4, 10) == [(4, 3)]
    assert B.layerskip_rounds([False] * 3, 1, 3) == [(1, 1), (1, 1), (0, 1)]
    assert B.layerskip_rounds([], 3, 5) == []
    with pytest.raises(ValueError):
        B.layerskip_rounds([True] * 4, 2, 3)


def random_trace(rng: random.Random, n: int, length: int, budget_extra: int = 0) -> ExitTrace:
    tokens = tuple(rng.randrange(5) for _ in range(length))
    cands = tuple(tuple(x if rng.random() < 0.5 else rng.randrange(5) for _ in range(n - 1)) + (x,) for x in tokens)
    ead = tuple(rng.randrange(n) for _ in tokens)
    return ExitTrace(tokens, cands, ead, length + budget_extra)


@pytest.mark.parametrize("seed", range(6))
def test_formulas_are_the_lattice_semantics(seed):
    """Replaying the real Lattice (unbounded width, no DECS) gives the same ticks as the formulas."""
    rng = random.Random(seed)
    n = rng.randint(2, 5)
    trace = random_trace(rng, n, rng.randint(1, 14), budget_extra=rng.choice([0, 3]))
    assert B.replay_lattice(trace).ticks == B.shallowest_match_cost([trace]).ticks
    for k in range(n - 1):
        single = B.replay_lattice(trace, allowed_exits={k}, off_path_proposes=True)
        assert single.ticks == B.pipeline_ticks(
            [k if c[k] == x else None for c, x in zip(trace.candidates, trace.tokens)], n)


def test_costs_add_over_prompts():
    a, b = B.ar_cost([TRACE], 3), B.ar_cost([TRACE, TRACE], 3)
    assert a + a == b
    assert (TickCost(1, 1, None) + TickCost(2, 1, 4)).stage_forwards is None
