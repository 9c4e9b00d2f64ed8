"""Pipelined executor: rank ``r`` runs stage ``r`` of every tick; the lattice is replicated.

Every rank holds the same pure :class:`~dex_adapt.lattice.Lattice` and feeds it the same inputs, so
all ranks plan the same ticks and apply the same commits and collapses to their own KV caches: the
pipelined executor is another way to run the lattice's plan, not a second DEX. Per tick, on rank r::

    irecv  hidden [B_{r-1}, H] from r-1     (posted first: arrives while we compute)
    run    stage r over this tick's batch   (inputs received in earlier ticks)
    isend  hidden [B_r, H] to r+1           (its branches run stage r+1 in a later tick)
    all_gather exit outcomes                (candidate + confidence per task; the reference from
                                             the last rank) -> every rank's lattice.apply
    wait   the irecv; keep what arrived for the branches still alive

The all_gather is the one synchronisation point per tick; hidden states travel point to point
and overlap with compute.
"""

from __future__ import annotations

import os
import signal
from datetime import timedelta

import torch
import torch.distributed as dist

from ..exploration import ExplorationSet
from ..executor import StageRunner
from ..lattice import Proposal, TickPlan, TickResult
from ..model_surgery import StagedModel
from ..sampling import Sampler
from .dist import DistContext, Heartbeat, PipelineFault

__all__ = ["PipelinedExecutor"]

#: Test seam for fault handling: ``"RANK:TICK:kill"`` or ``"RANK:TICK:hang"`` makes that rank
#: SIGKILL or SIGSTOP itself at that tick of the first prompt.
FAULT_ENV = "DEX_FAULT_INJECT"


class PipelinedExecutor:
    """Runs stage ``ctx.rank`` of each tick; same interface as the single-process executor."""

    def __init__(self, staged: StagedModel, exploration: ExplorationSet, sampler: Sampler,
                 ctx: DistContext, timeout_s: float = 60.0, heartbeat: Heartbeat | None = None) -> None:
        if exploration.num_stages != ctx.world_size:
            raise ValueError(f"{exploration.num_stages} explorers need {exploration.num_stages} ranks, "
                             f"got {ctx.world_size}")
        self.runner = StageRunner(staged, exploration, sampler)
        self.ctx = ctx
        self.stage = ctx.rank
        self.last = exploration.num_stages - 1
        self.hidden_size = staged.config.hidden_size
        self.dtype = staged.dtype
        self.device = staged.device
        self.timeout = timedelta(seconds=timeout_s)
        self.heartbeat = heartbeat or Heartbeat(ctx)  # one per process: pass it in across prompts
        self.ticks = 0
        self._fault = _parse_fault(os.environ.get(FAULT_ENV), ctx.rank)

    # ------------------------------------------------------------- prompt
    def prefill(self, token_ids: list[int]) -> None:
        """The committed prompt prefix flows through the stages once, rank by rank."""
        if not token_ids:
            return
        layers = self.runner.exploration.stages[self.stage]
        hidden = None
        if self.stage > 0:
            hidden = torch.empty(1, len(token_ids), self.hidden_size, dtype=self.dtype, device=self.device)
            self._wait(dist.irecv(hidden, self.stage - 1), f"rank {self.stage - 1}")
        out = self.runner.prefill(token_ids, layers, hidden)
        if self.stage < self.last:
            self._wait(dist.isend(out.contiguous(), self.stage + 1), f"rank {self.stage + 1}")

    # ------------------------------------------------------------- ticks
    def run_tick(self, plan: TickPlan) -> tuple[dict[int, Proposal], int | None]:
        self.ticks += 1
        if self._fault and self._fault[0] == self.ticks:
            os.kill(os.getpid(), signal.SIGKILL if self._fault[1] == "kill" else signal.SIGSTOP)
        incoming = plan.stages[self.stage - 1] if self.stage > 0 else ()
        recv = buffer = None
        if incoming:
            buffer = torch.empty(len(incoming), self.hidden_size, dtype=self.dtype, device=self.device)
            recv = dist.irecv(buffer, self.stage - 1)
        tasks = plan.stages[self.stage]
        send, proposals, reference = None, {}, None
        if tasks:
            out, proposals, reference = self.runner.run_stage(self.stage, tasks)
            if self.stage < self.last:
                send = dist.isend(out[0].contiguous(), self.stage + 1)
        proposals, reference = self._exchange(plan, proposals, reference)
        if recv is not None:
            self._wait(recv, f"rank {self.stage - 1}")
            for j, task in enumerate(incoming):
                self.runner.hidden[task.branch] = buffer[j]
        if send is not None:
            self._wait(send, f"rank {self.stage + 1}")
        return proposals, reference

    def _exchange(self, plan: TickPlan, mine: dict[int, Proposal], reference: int | None):
        """All-gather every stage's exit outcomes: rows of (token, confidence), float64 is exact for ids."""
        rows = max(1, max(len(tasks) for tasks in plan.stages))
        local = torch.zeros(rows, 2, dtype=torch.float64, device=self.device)
        tasks = plan.stages[self.stage]
        if self.stage < self.last:
            for j, task in enumerate(tasks):
                p = mine[task.branch]
                local[j, 0] = -1 if p.token is None else p.token
                local[j, 1] = p.confidence
        elif reference is not None:
            local[0, 0] = reference
        else:
            local[0, 0] = -1
        gathered = [torch.empty_like(local) for _ in range(self.ctx.world_size)]
        try:
            dist.all_gather(gathered, local)
        except Exception as e:  # a peer died (connection closed) or hung (timeout)
            raise self._fault_error(e) from None
        proposals: dict[int, Proposal] = {}
        for stage, stage_tasks in enumerate(plan.stages[: self.last]):
            values = gathered[stage].cpu().tolist()
            for j, task in enumerate(stage_tasks):
                token, conf = values[j]
                proposals[task.branch] = Proposal(None if token < 0 else int(token), conf)
        ref = int(gathered[self.last][0, 0].item())
        return proposals, (ref if plan.stages[self.last] and ref >= 0 else None)

    def _wait(self, work, peer: str) -> None:
        try:
            if not work.wait(self.timeout):
                raise TimeoutError("timed out")
        except Exception as e:
            raise self._fault_error(e, peer) from None

    def _fault_error(self, error: Exception, peer: str | None = None) -> PipelineFault:
        who = self.heartbeat.culprit()
        if who.startswith("a peer rank") and peer is not None:
            who = peer
        kind = "timed out" if "timeout" in str(error).lower() or "timed out" in str(error).lower() else "lost"
        return PipelineFault(f"rank {self.ctx.rank}: {kind} contact with {who} at tick {self.ticks}")

    def apply(self, result: TickResult) -> None:
        self.runner.apply(result)


    @property
    def cache(self):
        return self.runner.cache


def _parse_fault(spec: str | None, rank: int):
    if not spec:
        return None
    r, tick, mode = spec.split(":")
    if int(r) != rank or mode not in ("kill", "hang"):
        return None
    return int(tick), mode
