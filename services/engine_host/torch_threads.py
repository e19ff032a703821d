"""Threads that run model code, each setting the process's torch thread count on itself.

`torch.set_num_threads` on the event loop's thread did not reach the stage threads: on this
CPU a stage thread reported 1 thread yet computed as if it ran the default team, so the same
block gave different low bits there than on the thread that set it (the loop test's audio
control caught it). Besides, a team of threads per stage on a small host only spins. So every
thread that runs model code sets the count itself when it starts.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import torch


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
