"""Threads that run model code, each setting the process's torch thread count on itself.

`torch.set_num_threads` on the event loop's thread did not reach the stage threads: on this
CPU a stage thread reported 1 thread yet computed as if it ran the default team, so the same
block gave different low bits there than on the thread that set it (the loop test's audio
control caught it). Besides, a team of threads per stage on a small host only spins. So every
thread that runs model code sets the count itself when it starts.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import torch


def default_count(cores: int, hosts_on_machine: int) -> int:
    """Torch threads for one engine host when none is configured: the machine's cores split between the
    engine hosts that share them. Torch's own default (every physical core, in every process) made
    two CPU hosts on a 2-core machine run four compute threads on two cores, about 9x slower under
    load (docs/decisions.md, "Torch threads split the cores")."""
    return max(1, cores // max(1, hosts_on_machine))


def machine_cores() -> int:
    """The cores this process may run on (its CPU affinity, which a container's cpuset narrows)."""
    return len(os.sched_getaffinity(0))


def executor(name: str, workers: int = 1) -> ThreadPoolExecutor:
    """A pool whose threads run torch with the thread count the process has now."""
    return ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name,
                              initializer=torch.set_num_threads, initargs=(torch.get_num_threads(),))


def thread(target: Callable[[], object], name: str) -> threading.Thread:
    """A daemon thread (not started) that runs `target` with the thread count the process has now."""
    n = torch.get_num_threads()

    def run() -> None:
        torch.set_num_threads(n)
        target()

    return threading.Thread(target=run, name=name, daemon=True)
