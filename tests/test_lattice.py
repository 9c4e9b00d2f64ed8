"""The lattice with scripted exits: the tick cost model of DESIGN.md §4, exactly.

A scripted world has a true sequence ``truth(p)``; exit ``i`` of a branch at position ``p`` is
"right" (proposes ``truth(p + 1)``) when the script says so, otherwise it proposes a wrong token.
The final stage always yields ``truth(p + 1)`` for the anchor.
"""

from __future__ import annotations

import random

import pytest

from dex_adapt.lattice import Lattice, Proposal

V = 1000


def truth(p: int) -> int:
    return (p * 7 + 3) % V


def wrong(p: int, i: int, k: int = 0) -> int:
    return (truth(p) + 1 + i + k) % V


def pick(task, exit_index, right, same_wrong=False, truth_second=False):
    """The candidate exit ``exit_index`` proposes for ``task`` (honouring DECS exclusions).

    ``truth_second``: every exit ranks one wrong token first and the truth second.
    """
    target = task.position + 1
    if right(task.position, exit_index) and truth(target) not in task.exclude:
        return truth(target)
    if truth_second:
        first = wrong(target, 0)
        return truth(target) if first in task.exclude else first
    k = 0
    while True:  # the first wrong token not excluded
        token = wrong(target, 0 if same_wrong else exit_index, k)
        if token not in task.exclude and token != truth(target):
            return token
        k += 1


def run_scripted(N, right, T, *, width=None, decs=True, policy="fifo", max_branches=256,
                 same_wrong=False, truth_second=False, check=None):
    lattice = Lattice(N, width=width, decs=decs, policy=policy, max_branches=max_branches)
    lattice.start(position=0, token=truth(0), limit_position=T)
    out = []
    while len(out) < T:
        plan = lattice.plan()
        if check:
            check(lattice, plan)
        proposals, reference = {}, None
        for stage, tasks in enumerate(plan.stages):
            for task in tasks:
                if stage == N - 1:
                    assert task.is_anchor
                    reference = truth(task.position + 1)
                else:
                    token = pick(task, stage, right, same_wrong, truth_second)
                    conf = 0.9 if token == truth(task.position + 1) else 0.1 / (1 + stage)
                    proposals[task.branch] = Proposal(token, conf)
        result = lattice.apply(proposals, reference)
        if result.committed_token is not None:
            out.append(result.committed_token)
    assert out == [truth(p) for p in range(1, T + 1)]
    return lattice.stats


@pytest.mark.parametrize("N", [1, 2, 3, 4, 8])
def test_always_right_at_exit0_costs_one_tick_per_token(N):
    T = 50
    stats = run_scripted(N, lambda p, i: True, T)
    # The first token traverses all N stages; every later one is 1 tick behind its parent.
    assert stats.ticks == N + (T - 1)
    if N > 1:
        assert stats.accepted_by_exit[0] == T - 1 and stats.fallbacks == 0  # the last token keeps no child


@pytest.mark.parametrize("N", [1, 2, 4, 8])
@pytest.mark.parametrize("decs", [True, False])
def test_never_right_costs_n_ticks_per_token(N, decs):
    T = 30
    stats = run_scripted(N, lambda p, i: False, T, decs=decs)
    assert stats.ticks == N * T
    assert stats.fallbacks == T - 1  # the last commit has nothing left to fall back to


def test_a_proposal_refused_for_budget_stays_proposable():
    """DECS masks only tokens that got a child: a candidate the full budget refused can be proposed
    again by a deeper exit (masking it made the right continuation unreachable: a fallback)."""
    lattice = Lattice(4, max_branches=2)
    lattice.start(0, 10)
    (anchor,) = lattice.plan().stages[0]
    lattice.apply({anchor.branch: Proposal(11, 0.9)}, None)  # child 11 spawned: the budget is full
    plan = lattice.plan()
    lattice.apply({t.branch: Proposal(12 if t.is_anchor else 20, 0.5) for s in plan.stages[:3] for t in s}, None)
    assert sorted(b.token for b in lattice.live.values()) == [10, 11], "12 and 20 refused: no room"
    plan = lattice.plan()
    (task,) = [t for t in plan.stages[2] if t.is_anchor]
    assert task.exclude == (11,)  # 12 was refused, not spawned: exit 2 may propose it again


@pytest.mark.parametrize("N,budget", [(8, 9), (8, 16), (16, 17), (16, 64)])
def test_a_full_budget_still_keeps_the_right_continuation(N, budget):
    """Exit 0 is always right; with DECS every deeper exit adds an unlikely hedge that soon fills
    the budget. The right child may be refused when proposed, but a deeper exit proposes it again,
    so no commit falls back (with refused tokens masked: 3-6 fallbacks here, 89 ticks at N = 8,
    B = 9 against 55 now and 47 unbounded)."""
    T = 40
    stats = run_scripted(N, lambda p, i: True, T, max_branches=budget, check=_invariants)
    assert stats.max_live == budget, "the budget must actually bind in this scenario"
    assert stats.fallbacks == 0
    assert stats.ticks < N * T


@pytest.mark.parametrize("N,i", [(2, 0), (4, 1), (4, 2), (8, 5), (8, 6)])
def test_right_only_at_exit_i_costs_i_plus_one(N, i):
    T = 40
    stats = run_scripted(N, lambda p, j: j == i, T)
    assert stats.ticks == N + (T - 1) * (i + 1)
    assert stats.accepted_by_exit[i] == T - 1


@pytest.mark.parametrize("seed", range(20))
def test_width_one_is_never_worse_than_ar(seed):
    rng = random.Random(seed)
    N = rng.randint(1, 8)
    table = {}

    def right(p, i):
        return table.setdefault((p, i), rng.random() < 0.4)

    T = 60
    stats = run_scripted(N, right, T, width=1, policy=rng.choice(["confidence", "fifo"]))
    assert stats.ticks <= N * T


def _invariants(lattice, plan):
    final = lattice.num_stages - 1
    for branch in lattice.live.values():
        if branch.parent is not None:
            assert branch.stage < branch.parent.stage, "a child must stay behind its parent"
            assert branch.position == branch.parent.position + 1
    for stage, tasks in enumerate(plan.stages):
        if lattice.width is not None:
            assert len(tasks) <= lattice.width
        if tasks and lattice.anchor.stage == stage:
            assert tasks[0].is_anchor, "the anchor is admitted first"
        for task in tasks:
            branch = lattice.live[task.branch]
            assert branch.stage == stage
            assert stage != final or task.is_anchor
            assert len(set(task.exclude)) == len(task.exclude)
    assert len(lattice.live) <= lattice.max_branches


@pytest.mark.parametrize("seed", range(12))
def test_invariants_under_random_exits(seed):
    rng = random.Random(100 + seed)
    N = rng.randint(2, 10)
    table = {}

    def right(p, i):
        return table.setdefault((p, i), rng.random() < 0.5)

    run_scripted(N, right, 80, width=rng.choice([None, 1, 2, 5]), decs=rng.random() < 0.5,
                 policy=rng.choice(["confidence", "fifo"]), max_branches=rng.choice([4, 16, 256]),
                 check=_invariants)


def test_without_decs_duplicates_are_never_spawned():
    seen = []

    def check(lattice, plan):
        for branch in lattice.live.values():
            tokens = [c.token for c in branch.children.values()]
            assert len(tokens) == len(set(tokens))
            seen.append(len(tokens))

    # Every exit proposes the same wrong token: without DECS only one child ever results.
    run_scripted(6, lambda p, i: False, 20, decs=False, same_wrong=True, check=check)
    assert max(seen) == 1


def test_decs_makes_each_exit_a_new_hedge():
    seen = []

    def check(lattice, plan):
        for branch in lattice.live.values():
            proposed = [t for t in branch.proposed if t >= 0]
            assert len(proposed) == len(set(proposed))
            seen.append(len(branch.children))

    run_scripted(6, lambda p, i: False, 20, decs=True, same_wrong=True, check=check)
    assert max(seen) > 1


def test_decs_helps_when_deeper_exits_repeat_a_wrong_guess():
    """Every exit ranks the same wrong token first and the truth second: only DECS hedges."""
    never = lambda p, i: False  # noqa: E731
    plain = run_scripted(4, never, 30, decs=False, truth_second=True)
    assert plain.ticks == 4 * 30  # every exit repeats the wrong guess: pipelined-AR cost
    hedged = run_scripted(4, never, 30, decs=True, truth_second=True)
    assert hedged.ticks == 4 + 29 * 2  # exit 1, masked, proposes the truth: 2 ticks per token
    assert hedged.accepted_by_exit[1] == 29


def test_live_branches_stay_bounded_over_a_long_run():
    rng = random.Random(7)
    table = {}

    def right(p, i):
        return table.setdefault((p, i), rng.random() < 0.5)

    peak = []
    stats = run_scripted(4, right, 1000, check=lambda lattice, plan: peak.append(len(lattice.live)))
    # Collapse discards every subtree but the kept one: with N=4 at most ~2^N live at any time.
    assert max(peak) <= 2 ** 4
    assert stats.max_live == max(max(peak), stats.max_live)


def test_apply_requires_reference_exactly_when_anchor_finishes():
    lattice = Lattice(1)
    lattice.start(0, truth(0))
    lattice.plan()
    with pytest.raises(RuntimeError):
        lattice.apply({}, None)
    lattice = Lattice(2)
    lattice.start(0, truth(0))
    plan = lattice.plan()
    with pytest.raises(RuntimeError):
        lattice.apply({plan.stages[0][0].branch: Proposal(1, 0.5)}, 5)


@pytest.mark.parametrize("kwargs", [dict(width=0), dict(policy="random"), dict(max_branches=0)])
def test_invalid_settings(kwargs):
    with pytest.raises(ValueError):
        Lattice(4, **kwargs)
