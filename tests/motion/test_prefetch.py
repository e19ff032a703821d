"""Read-ahead on the worker pool (libs/motion/prefetch.py): leaving the block early (an error mid-round)
cancels what had not started and waits for what had, so no job touches a buffer its caller is about to
release (a shared-memory push writes into a peer's mapping that `close` then unmaps)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from libs.motion.prefetch import Prefetch


def test_leaving_early_waits_for_jobs_already_running_and_cancels_the_rest():
    started, finished = [], []
    release = threading.Event()

    def job(i: int) -> int:
        started.append(i)
        release.wait(5)
        time.sleep(0.05)  # still writing when the round fails
        finished.append(i)
        return i

    with ThreadPoolExecutor(2) as pool:
        threading.Timer(0.1, release.set).start()
        with pytest.raises(RuntimeError), Prefetch(job, list(range(8)), depth=4, pool=pool) as ahead:
            for _ in ahead:
                raise RuntimeError("the peer went away")  # before taking a single result
        assert sorted(finished) == sorted(started) and len(started) == 2  # both running ones done; none begun after
