"""The staging pool gives its memory back: a stopped endpoint's arena is not kept by its memfd.

A memfd holds its pages for as long as it is open, mapped or not, so a pool that only dropped its
mapping would keep the whole arena allocated until the process exits.
"""

from __future__ import annotations

import gc
import os

from libs.motion import pool
from libs.motion.endpoint import MotionEndpoint
from tests.support.dicthost import DictHost


def staging_fds() -> int:
    """Open descriptors of staging memfds in this process (a pool's own, and the one its mmap keeps)."""
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += "statefleet-staging" in os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
    return n


def test_close_gives_the_arena_back_and_hands_out_nothing_more():
    before = staging_fds()
    arena = pool.StagingPool(4 << 20)
    assert staging_fds() > before
    arena.close()
    assert staging_fds() == before and arena.mm.closed
    assert arena.take(1024) is None
    arena.close()  # twice is harmless


def test_a_region_in_use_outlives_close_and_does_not_return_to_a_closed_pool():
    before = staging_fds()
    arena = pool.StagingPool(4 << 20)
    _, view = arena.take(1 << 20)
    view.fill_(7)
    arena.close()
    assert not arena.mm.closed and int(view.sum()) == 7 << 20  # the installed bytes stay mapped
    del view
    gc.collect()
    assert arena.take(1024) is None and arena.free_bytes == 0
    del arena
    gc.collect()
    assert staging_fds() == before  # the mapping went with its last view


def test_a_pool_dropped_without_close_releases_its_memfd_when_collected():
    before = staging_fds()
    arena = pool.StagingPool(4 << 20)
    del arena
    gc.collect()
    assert staging_fds() == before


async def test_a_stopped_endpoint_closes_its_pool(nc):
    before = staging_fds()
    ep = MotionEndpoint(nc, "p", DictHost(), staging_bytes=4 << 20)
    await ep.start()
    assert staging_fds() > before and ep.pool is not None
    await ep.stop()
    assert staging_fds() == before and ep.pool.take(1) is None
