"""The one distributed helper: who am I, start the process group, degrade to one process.

Ranks come from the environment (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``), set
either by ``torchrun`` or by ``dex-decode --pipeline``'s own launcher. Backend: NCCL when CUDA is
available, gloo otherwise.
"""

from __future__ import annotations

import os
import threading
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
    """Liveness in the rendezvous store, so a rank that sees a peer fail can name it.

    A daemon thread stamps ``dex/heartbeat/<rank>`` every ``interval_s``. A killed or stopped
    process stops stamping; on a fault the survivors wait a few intervals and name the rank whose
    stamp is stale. (A live rank stuck in a deadlock keeps stamping and is reported as unknown.)
    """

    def __init__(self, ctx: DistContext, interval_s: float = 0.5) -> None:
        self.ctx = ctx
        self.interval_s = interval_s
        self.store = None
        if dist.is_initialized():
            store = dist.distributed_c10d._get_default_store()
            self.store = store.clone() if hasattr(store, "clone") else store
            self._stop = threading.Event()
            self._thread = threading.Thread(target=self._run, name="dex-heartbeat", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.store.set(f"dex/heartbeat/{self.ctx.rank}", f"{time.time():.3f}")
            except Exception:  # the store host is gone; the main thread reports the failure
                return
            self._stop.wait(self.interval_s)

    def stop(self) -> None:
        """Stop stamping and join the thread.

        Must run before the interpreter exits: a daemon thread caught inside a store call at
        finalisation is unwound by ``pthread_exit`` through C++ frames, which aborts the process
        ("terminate called without an active exception").
        """
        if self.store is not None:
            self._stop.set()
            self._thread.join(timeout=10 * self.interval_s + 30)

    def culprit(self) -> str:
        """Describe the peer that stopped (best effort, takes a few heartbeat intervals)."""
        if self.store is None:
            return "a peer rank"
        time.sleep(4 * self.interval_s)
        try:
            ages = {}
            for rank in range(self.ctx.world_size):
                key = f"dex/heartbeat/{rank}"
                if rank != self.ctx.rank:
                    ages[rank] = time.time() - float(self.store.get(key)) if self.store.check([key]) else float("inf")
        except Exception:  # the store itself is gone: its host died
            return "the rendezvous host (the launcher, or rank 0 under torchrun)"
        rank = max(ages, key=ages.get)
        if ages[rank] < 3 * self.interval_s:
            return "a peer rank (all peers are alive: a stall, not a crash)"
        return f"rank {rank}"
