"""A cancelled placement loop ends, even when what it awaits completes in the same loop turn.

On Python 3.11 `asyncio.wait_for` returns the inner result instead of raising when the
cancellation and the inner completion meet in one turn (CPython gh-86296), and nats-py waits
through it (`KeyWatcher.updates`, every request). A loop whose cancellation is lost outlives its
service: a stopped (or crashed) placement instance keeps acting, and whoever awaits it hangs."""

from __future__ import annotations

import asyncio

from libs import bus, names
from libs.schemas.base import encode
from libs.schemas.placement import HostRecord
from libs.tasks import cancel_and_wait
from services.placement.mirror import KvMirror


async def test_a_mirror_cancelled_while_updates_are_pending_ends(nc):
    kv = await bus.ensure_kv(nc.jetstream(), names.CAPACITY_BUCKET)
    for i in range(300):
        await kv.put(f"h{i}", encode(HostRecord(host_id=f"h{i}")))
    for _ in range(20):  # each round cancels at a different point of a busy watch (most land mid-update)
        mirror, busy = await _mirror_mid_watch(nc, kv)
        task = asyncio.create_task(mirror.run())
        await busy.wait()
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=2.0)
        assert task in done and task.cancelled(), "the mirror outlived its cancellation"

async def _mirror_mid_watch(nc, kv) -> tuple[KvMirror, asyncio.Event]:
    """A mirror, and an event set once it has taken 50 of the bucket's 300 keys (the rest are on their way)."""
    busy = asyncio.Event()
    seen: list[str] = []

    def changed(key: str, _value) -> None:
        seen.append(key)
        if len(seen) >= 50:
            busy.set()

    return KvMirror(nc, kv, HostRecord, silence_s=5.0, on_change=changed), busy

async def test_cancel_and_wait_ends_a_task_whose_first_cancellation_was_lost():
    async def swallows_once():
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            pass  # what a lost cancellation looks like from outside
        await asyncio.sleep(10)

    task = asyncio.create_task(swallows_once())
    await asyncio.sleep(0)
    assert await cancel_and_wait([task], timeout_s=2.0) == []
    assert task.cancelled()
