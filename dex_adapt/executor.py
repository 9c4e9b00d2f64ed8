"""Single-process executor: runs each tick's plan, all stages in turn, one batched forward per stage.

On one device every tick costs all N stage forwards, so this executor is for correctness, analysis
and the tick model; the pipelined executor runs the same plans with one explorer per process.
The stage computation itself (:class:`StageRunner`) is shared by both.
"""

from __future__ import annotations

import torch

from .exploration import ExplorationSet
from .lattice import Proposal, TickPlan, TickResult, Task
from .model_surgery import FULL, SLIDING, StagedModel
from .sampling import Sampler, propose
from .tree_cache import TreeCache

__all__ = ["StageRunner", "SingleProcessExecutor"]


class StageRunner:
    """Runs one or more stages of a :class:`StagedModel` over batches of branches.

    Holds the KV of its layers (a :class:`TreeCache`) and the hidden state each branch carries
    into the next stage it owns. A pipelined rank owns one stage; the single-process executor all.
    """

    def __init__(self, staged: StagedModel, exploration: ExplorationSet, sampler: Sampler) -> None:
        self.staged = staged
        self.exploration = exploration
        self.sampler = sampler
        self.cache = TreeCache(staged.num_layers, staged.device)
        self.hidden: dict[int, torch.Tensor] = {}  # branch id -> [H], input of its next stage
        self.windows = {spec.attention_type: spec.sliding_window for spec in staged.layer_specs}

    # ------------------------------------------------------------- prompt
    @torch.no_grad()
    def prefill(self, token_ids: list[int], layers: tuple[int, int] | None = None,
                hidden: torch.Tensor | None = None) -> torch.Tensor | None:
        """Commit a prompt prefix (positions 0..T-1) through ``layers``; returns the output hidden."""
        if not token_ids:
            return None
        start, end = layers if layers is not None else (0, self.staged.num_layers)
        positions = list(range(len(token_ids)))
        slots = self.cache.commit_prefix(positions)
        if hidden is None:
            hidden = self.staged.embed(torch.tensor([token_ids], device=self.staged.device))
        pos = torch.tensor(positions, device=self.staged.device)
        return self._forward(hidden, slots, [[] for _ in positions], pos, start, end, causal_prefix=True)

    # ------------------------------------------------------------- stages
    def _forward(self, hidden, slots, ancestor_slots, positions, start, end, causal_prefix=False):
        masks = {
            kind: self.cache.tree_mask(slots, ancestor_slots, positions, window, hidden.dtype, causal_prefix)
            for kind, window in self.windows.items()
        }
        position_ids = positions[None]  # [1, B]: the batch of branches lies along the sequence axis
        rope = self.staged.position_embeddings(hidden, position_ids)
        self.cache.set_write_slots(slots)
        return self.staged.run_layers(hidden, start, end, masks, position_ids, rope, self.cache)

    @torch.no_grad()
    def run_stage(self, stage: int, tasks: tuple[Task, ...], hidden: torch.Tensor | None = None):
        """Run ``tasks`` through ``stage``. Input hidden [1, B, H] (None: embed, or the stored states).

        Returns ``(output_hidden [1, B, H], proposals or None, reference or None)``: proposals for a
        non-final stage, the reference token for the anchor at the final stage.
        """
        staged, device = self.staged, self.staged.device
        ids = [t.branch for t in tasks]
        if hidden is None:
            if stage == 0:
                hidden = staged.embed(torch.tensor([[t.token for t in tasks]], device=device))
            else:
                hidden = torch.stack([self.hidden.pop(i) for i in ids])[None]
        positions = [t.position for t in tasks]
        slots = self.cache.allocate(ids, positions)
        ancestor_slots = [[self.cache.slot_of[a] for a in t.ancestors] for t in tasks]
        start, end = self.exploration.stages[stage]
        out = self._forward(hidden, slots, ancestor_slots, torch.tensor(positions, device=device), start, end)
        if stage == self.exploration.num_stages - 1:
            (task,) = tasks  # only the anchor reaches the final stage
            logits = staged.exit_logits(out[0, 0], end)
            return out, None, self.sampler(logits, task.position + 1)
        proposals = {t.branch: Proposal(None, 0.0) for t in tasks}
        rows = [j for j, t in enumerate(tasks) if t.propose]  # skip the exit head where no child can follow
        if rows:
            logits = staged.exit_logits(out[0, rows], end)
            tokens, conf = propose(logits, tuple(tasks[j].exclude for j in rows))
            for j, tok, c in zip(rows, tokens.tolist(), conf.tolist()):
                proposals[tasks[j].branch] = Proposal(int(tok), float(c))
        return out, proposals, None

    def keep_hidden(self, tasks: tuple[Task, ...], out: torch.Tensor) -> None:
        for j, t in enumerate(tasks):
            self.hidden[t.branch] = out[0, j]

    def apply(self, result: TickResult) -> None:
        """Mirror the lattice's collapse on this runner's KV and carried states."""
        self.cache.release(result.discarded)
        for bid in result.discarded:
            self.hidden.pop(bid, None)
        if result.committed_branch is not None:
            self.cache.commit(result.committed_branch)
            self.hidden.pop(result.committed_branch, None)


class SingleProcessExecutor:
    """Every stage on one device, in stage order within a tick."""

    def __init__(self, staged: StagedModel, exploration: ExplorationSet, sampler: Sampler) -> None:
        self.runner = StageRunner(staged, exploration, sampler)

    def prefill(self, token_ids: list[int]) -> None:
        self.runner.prefill(token_ids)

    def run_tick(self, plan: TickPlan) -> tuple[dict[int, Proposal], int | None]:
        proposals: dict[int, Proposal] = {}
        reference = None
        last = len(plan.stages) - 1
        for stage, tasks in enumerate(plan.stages):
            if not tasks:
                continue
            out, props, ref = self.runner.run_stage(stage, tasks)
            if stage < last:
                self.runner.keep_hidden(tasks, out)
                proposals.update(props)
            else:
                reference = ref
        return proposals, reference

    def apply(self, result: TickResult) -> None:
        self.runner.apply(result)

    @property
    def cache(self) -> TreeCache:
        return self.runner.cache
