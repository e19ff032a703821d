"""Threads that run model code, each setting its torch intra-op thread count on itself.

`torch.set_num_threads` on the event loop's thread did not reach the stage threads: on this
CPU a stage thread reported 1 thread yet computed as if it ran the default team, so the same
block gave different low bits there than on the thread that set it (the loop test's audio
control caught it). Besides, a team of threads per stage on a small host only spins. So every
thread that runs model code sets the count itself (`pin`).

The count is a thread's own (its OpenMP team and MKL's count), but torch sets it lazily from a
process-wide value at the thread's first op, and `set_num_threads` also writes that value: a thread
that sets its count before its first op gets whatever another thread set last. `pin` reads the count
first (which makes that lazy start happen), then sets it; after that the thread keeps its count
whatever other threads set. That is what lets a T0/T1 session run at the count it was started with
on a host whose own count differs (`Session.threads`, docs/decisions.md "A session keeps its thread
count"): MKL's GEMM gives other low bits at 1 thread than at 2.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import torch

T = TypeVar("T")


def default_count(cores: int, hosts_on_machine: int) -> int:
    """Torch threads for one engine host when none is configured: the machine's cores split between the
    engine hosts that share them. Torch's own default (every physical core, in every process) made
    two CPU hosts on a 2-core machine run four compute threads on two cores, about 9x slower under
    load (docs/decisions.md, "Torch threads split the cores")."""
    return max(1, cores // max(1, hosts_on_machine))


def machine_cores() -> int:
    """The cores this process may run on (its CPU affinity, which a container's cpuset narrows)."""
    return len(os.sched_getaffinity(0))


def pin(n: int) -> None:
    """Run this thread's torch ops with `n` intra-op threads from now on (see the module doc)."""
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)


def pinned(n: int, fn: Callable[..., T]) -> Callable[..., T]:
    """`fn` run at `n` threads on whichever thread calls it, that thread's count put back after."""
    def run(*args: object, **kwargs: object) -> T:
        before = torch.get_num_threads()
        pin(n)
        try:
            return fn(*args, **kwargs)
        finally:
            pin(before)

    return run


def executor(name: str, workers: int = 1) -> ThreadPoolExecutor:
    """A pool whose threads run torch with the thread count the calling thread has now."""
    return ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name,
                              initializer=pin, initargs=(torch.get_num_threads(),))


def thread(target: Callable[[], object], name: str) -> threading.Thread:
    """A daemon thread (not started) that runs `target` with the thread count the calling thread has now."""
    n = torch.get_num_threads()

    def run() -> None:
        pin(n)
        target()

    return threading.Thread(target=run, name=name, daemon=True)
