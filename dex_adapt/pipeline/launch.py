"""``dex-decode --pipeline`` without torchrun: start N local ranks and watch them.

The launcher hosts the rendezvous store, starts one process per explorer (each dies with the
launcher: no orphans), and waits. When a rank fails, the others notice within the fault timeout
(a dead peer closes its sockets at once; a hung one trips the collective timeout) and exit
non-zero naming it; whatever is still alive after the timeout is killed. The launcher's own exit
status is 0 only if every rank succeeded.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time

__all__ = ["launch_local"]

CHILD_ENV = "DEX_PIPELINE_CHILD"


def _die_with_parent() -> None:  # runs in the child before exec (Linux): SIGKILL when the launcher dies
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def launch_local(argv: list[str], world_size: int, timeout_s: float, threads: int | None = None) -> int:
    from torch.distributed import TCPStore

    store = TCPStore("127.0.0.1", 0, world_size, is_master=True, wait_for_workers=False)
    env = dict(os.environ)
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(store.port), WORLD_SIZE=str(world_size),
               **{CHILD_ENV: "1"})
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    procs = []
    for rank in range(world_size):
        env_r = dict(env, RANK=str(rank), LOCAL_RANK=str(rank))
        procs.append(subprocess.Popen([sys.executable, "-m", "dex_adapt.cli.decode", *argv], env=env_r,
                                      preexec_fn=_die_with_parent))
    first_failure: tuple[int, int] | None = None
    deadline = None
    try:
        while True:
            codes = [p.poll() for p in procs]
            for rank, code in enumerate(codes):
                if code not in (None, 0) and first_failure is None:
                    first_failure = (rank, code)
                    deadline = time.monotonic() + timeout_s + 5
            if all(c is not None for c in codes):
                break
            if deadline is not None and time.monotonic() > deadline:
                for p in procs:
                    if p.poll() is None:
                        p.kill()
                break
            time.sleep(0.05)
    except KeyboardInterrupt:
        for p in procs:
            p.kill()
        raise
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    if first_failure is None:
        return 0
    rank, code = first_failure
    how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
    print(f"dex-decode: pipeline failed: rank {rank} ended first ({how})", file=sys.stderr)
    return code if code > 0 else 1
