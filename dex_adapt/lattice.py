"""The DEX lattice: expand, commit, collapse (DESIGN.md §3), as pure bookkeeping.

The lattice knows nothing of tensors, HF or torch.distributed. Each tick it *plans* which branches
run which stage (at most ``width`` per stage, the anchor first), and it *applies* what the executor
reports back: one candidate per branch that finished a non-final stage, and the reference token
when the anchor finished the final stage. Executors (single-process, pipelined) only run the plan.

Invariants the executors rely on:

* A branch runs stage ``s`` only after its parent finished stage ``s`` (or its parent is
  committed), so every KV entry it attends to exists. Hence a child is always strictly behind its
  parent and only the anchor ever runs the final stage.
* A branch's uncommitted ancestors are the KV entries it may attend to besides the committed
  prefix; :class:`Task` carries them so an executor needs no tree of its own.
* At most one child per (parent, token): without DECS a duplicate candidate spawns nothing; with
  DECS the executor masks the branch's earlier proposals (``Task.exclude``), so each exit hedges.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Branch", "Task", "TickPlan", "Proposal", "TickResult", "LatticeStats", "Lattice", "POLICIES"]

#: Admission policies for non-anchor branches when more than ``width`` wait at a stage.
POLICIES = ("fifo", "confidence")


@dataclass(eq=False)
class Branch:
    """One token at one position being pushed through the stages."""

    id: int
    position: int
    token: int
    parent: Branch | None  # None once the parent is committed (the anchor has no live parent)
    origin_exit: int | None  # the parent's exit that proposed this token; None for start/fallback
    score: float  # product of exit confidences along the speculative path (anchor: 1.0)
    stage: int = 0  # next stage to run == number of stages done
    children: dict[int, Branch] = field(default_factory=dict)  # token -> child
    proposed: list[int] = field(default_factory=list)  # exit i's candidate at index i; -1: none or refused


@dataclass(frozen=True)
class Task:
    """Run one branch through one stage."""

    branch: int
    position: int
    token: int
    ancestors: tuple[int, ...]  # uncommitted ancestor branch ids, nearest first
    exclude: tuple[int, ...]  # DECS: tokens this branch's shallower exits proposed and got a child for
    is_anchor: bool
    propose: bool = True  # False when no child could be spawned: executors may skip the exit head


@dataclass(frozen=True)
class TickPlan:
    """Per stage, the tasks of this tick (``stages[i]`` is explorer ``i``'s batch)."""

    stages: tuple[tuple[Task, ...], ...]


@dataclass(frozen=True)
class Proposal:
    """Exit output of a branch that finished a non-final stage."""

    token: int | None  # candidate for position + 1 (None: the exit proposed nothing usable)
    confidence: float  # the exit's probability of ``token``


@dataclass(frozen=True)
class TickResult:
    committed_token: int | None  # the reference token appended this tick, if any
    committed_branch: int | None  # the old anchor, whose KV joins the committed prefix
    discarded: tuple[int, ...]  # branches whose KV (if any) must be freed


@dataclass
class LatticeStats:
    """Tick accounting (DESIGN.md §4). Each commit's collapse either keeps a child proposed by exit
    ``i`` (``accepted_by_exit[i] += 1``: the next token costs ``i + 1`` ticks) or falls back (``N``
    ticks). The commit at ``limit_position`` (the last requested token) keeps nothing and counts as
    neither, so a run that ends there has ``sum(accepted_by_exit) + fallbacks == committed - 1``."""

    ticks: int = 0
    committed: int = 0
    fallbacks: int = 0
    stage_forwards: int = 0  # branch-stage forwards, discarded work included
    accepted_by_exit: list[int] = field(default_factory=list)
    max_live: int = 0


class Lattice:
    """Expand–commit–collapse over ``num_stages`` explorers.

    Args:
        num_stages: N, the number of explorers; exit ``N-1`` is the reference.
        width: at most this many branches per stage per tick (None: unbounded).
        decs: depth-coupled sampling; when off, duplicates are still never spawned.
        policy: admission order after the anchor: ``"fifo"`` (spawn order, the default) or
            ``"confidence"`` (path score); which is better depends on the model (results/README.md).
        max_branches: expansion budget, live branches including the anchor. When full, a new
            child replaces the lowest-scoring leaf that has not run yet if it scores higher,
            otherwise it is not spawned (and DECS does not mask it: a deeper exit may propose it
            again). Speculation never affects the output, only the cost.
    """

    def __init__(
        self,
        num_stages: int,
        width: int | None = None,
        decs: bool = True,
        policy: str = "fifo",
        max_branches: int = 256,
    ) -> None:
        if num_stages < 1:
            raise ValueError("num_stages must be >= 1")
        if width is not None and width < 1:
            raise ValueError(f"width must be >= 1, got {width}")
        if policy not in POLICIES:
            raise ValueError(f"unknown admission policy {policy!r}; choose from {', '.join(POLICIES)}")
        if max_branches < 1:
            raise ValueError(f"max_branches must be >= 1, got {max_branches}")
        self.num_stages = num_stages
        self.width = width
        self.decs = decs
        self.policy = policy
        self.max_branches = max_branches
        self.live: dict[int, Branch] = {}
        self.anchor: Branch | None = None
        self.limit_position: int | None = None
        self.stats = LatticeStats(accepted_by_exit=[0] * (num_stages - 1))
        self._next_id = 0
        self._plan: TickPlan | None = None

    # ---------------------------------------------------------------- setup
    def start(self, position: int, token: int, limit_position: int | None = None) -> Branch:
        """Begin at the last prompt token. No child is spawned at ``limit_position`` or beyond."""
        self.limit_position = limit_position
        self.anchor = self._new_branch(position, token, parent=None, origin_exit=None, score=1.0)
        return self.anchor

    def _new_branch(self, position, token, parent, origin_exit, score) -> Branch:
        branch = Branch(self._next_id, position, token, parent, origin_exit, score)
        self._next_id += 1
        self.live[branch.id] = branch
        if parent is not None:
            parent.children[token] = branch
        self.stats.max_live = max(self.stats.max_live, len(self.live))
        return branch

    # ---------------------------------------------------------------- plan
    def plan(self) -> TickPlan:
        """Admit at most ``width`` eligible branches per stage, the anchor first."""
        waiting: list[list[Branch]] = [[] for _ in range(self.num_stages)]
        for branch in self.live.values():
            parent = branch.parent
            if parent is None or parent.stage > branch.stage:
                waiting[branch.stage].append(branch)
        stages = []
        for s, branches in enumerate(waiting):
            branches.sort(key=self._priority)
            if self.width is not None:
                branches = branches[: self.width]
            if s == self.num_stages - 1:
                assert all(b is self.anchor for b in branches), "only the anchor may reach the final stage"
            stages.append(tuple(self._task(b) for b in branches))
        self._plan = TickPlan(tuple(stages))
        return self._plan

    def _priority(self, branch: Branch):
        if branch is self.anchor:
            return (0, 0.0, 0)
        if self.policy == "confidence":
            return (1, -branch.score, branch.id)
        return (1, 0.0, branch.id)

    def _task(self, branch: Branch) -> Task:
        ancestors, node = [], branch.parent
        while node is not None:
            ancestors.append(node.id)
            node = node.parent
        exclude = tuple(t for t in branch.proposed if t >= 0) if self.decs else ()
        propose = self.max_branches > 1 and (self.limit_position is None
                                             or branch.position + 1 < self.limit_position)
        return Task(branch.id, branch.position, branch.token, tuple(ancestors), exclude, branch is self.anchor,
                    propose)

    # ---------------------------------------------------------------- apply
    def apply(self, proposals: dict[int, Proposal], reference: int | None) -> TickResult:
        """Expand every branch that ran a non-final stage; commit and collapse if the anchor finished.

        ``proposals`` maps branch id -> :class:`Proposal` for every task of a non-final stage;
        ``reference`` is the final-depth token for ``anchor.position + 1`` when the anchor ran the
        final stage this tick (else None).
        """
        plan, self._plan = self._plan, None
        if plan is None:
            raise RuntimeError("apply() without plan()")
        self.stats.ticks += 1
        discarded: list[int] = []
        final = self.num_stages - 1
        for s, tasks in enumerate(plan.stages):
            self.stats.stage_forwards += len(tasks)
            for task in tasks:
                branch = self.live.get(task.branch)
                if branch is None:  # evicted earlier in this tick
                    continue
                branch.stage += 1
                if s < final:
                    self._expand(branch, s, proposals[task.branch], discarded)
        anchor_done = self.anchor is not None and self.anchor.stage == self.num_stages
        if anchor_done != (reference is not None):
            raise RuntimeError("a reference token must be given exactly when the anchor finishes the final stage")
        if reference is None:
            return TickResult(None, None, tuple(discarded))
        old = self.anchor
        self._commit_and_collapse(reference, discarded)
        return TickResult(reference, old.id, tuple(discarded))

    def _expand(self, branch: Branch, exit_index: int, proposal: Proposal, discarded: list[int]) -> None:
        """Depth expansion is ``branch.stage += 1``; here is the position expansion from exit ``exit_index``."""
        token = proposal.token
        if token is None or token in branch.children:
            branch.proposed.append(-1 if token is None else token)
            return
        position = branch.position + 1
        if self.limit_position is not None and position >= self.limit_position:
            branch.proposed.append(token)
            return
        score = branch.score * proposal.confidence
        if len(self.live) >= self.max_branches and not self._evict_for(score, discarded):
            # Refused for budget: DECS must not mask it, so a deeper exit can propose it again.
            branch.proposed.append(-1)
            return
        branch.proposed.append(token)
        self._new_branch(position, token, parent=branch, origin_exit=exit_index, score=score)

    def _evict_for(self, score: float, discarded: list[int]) -> bool:
        """Drop the lowest-scoring leaf that has not run yet, if it scores below ``score``.

        Leaves that have run some stages are kept: evicting the least likely leaf at any stage
        threw away half-run chains and cost more ticks on the shipped models (results/README.md).
        """
        victims = [b for b in self.live.values() if b.stage == 0 and not b.children and b is not self.anchor]
        if not victims:
            return False
        victim = min(victims, key=lambda b: (b.score, -b.id))
        if victim.score >= score:
            return False
        self._discard(victim, discarded)
        return True

    def _commit_and_collapse(self, reference: int, discarded: list[int]) -> None:
        old = self.anchor
        self.stats.committed += 1
        keep = old.children.get(reference)
        for child in list(old.children.values()):
            if child is not keep:
                self._discard(child, discarded)
        del self.live[old.id]
        if keep is None:
            # At the limit no child can exist: the decode ends here, nothing falls back.
            if self.limit_position is None or old.position + 1 < self.limit_position:
                self.stats.fallbacks += 1
            keep = self._new_branch(old.position + 1, reference, parent=None, origin_exit=None, score=1.0)
        else:
            self.stats.accepted_by_exit[keep.origin_exit] += 1
            keep.parent = None
            self._rescore(keep)
        old.children.clear()
        self.anchor = keep

    def _rescore(self, root: Branch) -> None:
        """Path scores are relative to the anchor: renormalise (every live branch descends from it),
        which keeps the admission order and stops the products underflowing on long decodes."""
        factor = root.score if root.score > 0 else 1.0
        for branch in self.live.values():
            branch.score /= factor

    def _discard(self, root: Branch, discarded: list[int]) -> None:
        stack = [root]
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            node.children.clear()
            if node.parent is not None and node.parent.children.get(node.token) is node:
                del node.parent.children[node.token]
            self.live.pop(node.id, None)
            discarded.append(node.id)

    # ---------------------------------------------------------------- views
    def live_count(self) -> int:
        return len(self.live)
