"""The one distributed helper: who am I, start the process group, degrade to one process.

Ranks come from the environment (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``), set
either by ``torchrun`` or by ``dex-decode --pipeline``'s own launcher. Backend: NCCL when CUDA is
available, gloo otherwise.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

__all__ = ["DistContext", "from_env", "init", "shutdown", "Heartbeat", "PipelineFault"]


class PipelineFault(RuntimeError):
    """A peer rank died or stopped responding (the message names it)."""


@dataclass(frozen=True)
class DistContext:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def backend(self) -> str:
        return "nccl" if torch.cuda.is_available() else "gloo"

    @property
    def device(self) -> torch.device:
        if torch.cuda.is_available():
            return torch.device("cuda", self.local_rank % torch.cuda.device_count())
        return torch.device("cpu")


def from_env() -> DistContext:
    """The launched rank, or a single process when no launcher set the environment."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return DistContext()
    return DistContext(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]),
                       int(os.environ.get("LOCAL_RANK", os.environ["RANK"])))


def init(ctx: DistContext, timeout_s: float) -> None:
    """Join the process group; every blocking collective then fails after ``timeout_s``."""
    if not ctx.distributed or dist.is_initialized():
        return
    if torch.cuda.is_available():
        torch.cuda.set_device(ctx.device)
    timeout = timedelta(seconds=timeout_s)
    store = None
    if os.environ.get("DEX_PIPELINE_CHILD"):  # dex-decode's own launcher hosts the store
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), ctx.world_size,
                              is_master=False, timeout=timeout)
    dist.init_process_group(ctx.backend, store=store, rank=ctx.rank, world_size=ctx.world_size, timeout=timeout)


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


class Heartbeat:
    """Each rank records its progress in the rendezvous store, so a rank that sees a peer fail can
    name the one that stopped: the rank whose last beat is oldest (or that never beat at all)."""

    def __init__(self, ctx: DistContext, interval_s: float = 0.5) -> None:
        self.ctx = ctx
        self.interval_s = interval_s
        self._last = 0.0
        self.store = dist.distributed_c10d._get_default_store() if dist.is_initialized() else None

    def beat(self, tick: int, force: bool = False) -> None:
        now = time.time()
        if self.store is None or (not force and now - self._last < self.interval_s):
            return
        self._last = now
        self.store.set(f"dex/heartbeat/{self.ctx.rank}", f"{now:.3f}")

    def culprit(self) -> str:
        """Describe the peer most likely at fault, from the store (best effort)."""
        if self.store is None:
            return "a peer rank"
        try:
            self.store.set_timeout(timedelta(seconds=2))
            ages = {}
            for rank in range(self.ctx.world_size):
                if rank == self.ctx.rank:
                    continue
                key = f"dex/heartbeat/{rank}"
                ages[rank] = time.time() - float(self.store.get(key)) if self.store.check([key]) else float("inf")
        except Exception:  # the store itself is gone: its host (the launcher or rank 0) died
            return "the rendezvous host (launcher or rank 0)"
        rank = max(ages, key=ages.get)
        age = ages[rank]
        return f"rank {rank} (no heartbeat{'' if age == float('inf') else f' for {age:.0f} s'})"
