"""An unfenced session's output goes out through its outbox: every block once, in block order, off the
block's critical path (the next block runs while one is published), bounded, and out before `advance`
returns or a block boundary is held; a journal attached later publishes nothing before it is drained."""

from __future__ import annotations

import asyncio

import pytest

from libs.fence import session_log
from libs.fence.block_journal import BlockJournal
from libs.schemas.base import decode
from libs.schemas.engine import OpenSession, OutputChunk
from libs.schemas.fence import Owner
from services.engine_host.runtime import EngineRuntime
from services.engine_host.sink import MAX_JOURNAL_BACKLOG
from tests.support.waiting import eventually

DEADLINE_S = 60.0


async def until(cond, what: str) -> None:
    await eventually(cond, timeout_s=DEADLINE_S, every_s=0.005, what=what)


class GatedBus:
    """Collects frame chunks' blocks in publish order; while `gate` is clear, publishing waits (a slow
    subscriber side), and each publish notes how far the session's blocks had got ahead of it."""

    def __init__(self) -> None:
        self.blocks: list[int] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.rt: EngineRuntime | None = None
        self.ahead: list[int] = []

    async def __call__(self, subject: str, payload: bytes) -> None:
        chunk = decode(payload, OutputChunk)
        if chunk.kind != "frames" or chunk.part != 0:
            return
        await self.gate.wait()
        self.ahead.append(self.rt.info(chunk.session_id).blocks_done - chunk.block)
        self.blocks.append(chunk.block)


@pytest.fixture
async def served():
    """A runtime publishing to a `GatedBus`, with one world session "o" open."""
    bus = GatedBus()
    rt = EngineRuntime("cpu", host_id="h1", publish=bus)
    bus.rt = rt
    await rt.start()
    await rt.open(OpenSession(session_id="o", backend="world", seed=1))
    yield rt, bus
    await rt.stop()


async def test_blocks_run_on_while_output_waits_and_it_goes_out_in_order_bounded(served):
    rt, bus = served
    await rt.advance("o", 3)
    assert bus.blocks == [1, 2, 3]  # out before advance returned
    bus.gate.clear()
    ahead = MAX_JOURNAL_BACKLOG + 20
    running = asyncio.create_task(rt.advance("o", ahead))
    # Block 4's output is stuck, yet later blocks run: the encode and publish are off their path...
    await until(lambda: rt.info("o").blocks_done >= 3 + 5, "blocks waited for an earlier block's output")
    # ...up to the bound, where the sink waits for the outbox.
    await until(lambda: rt.sessions.get("o").outbox.backlog >= MAX_JOURNAL_BACKLOG, "the outbox never filled")
    assert rt.info("o").blocks_done < 3 + ahead and not running.done()
    bus.gate.set()
    await running
    assert bus.blocks == list(range(1, 3 + ahead + 1))  # once each, in block order
    assert max(bus.ahead) <= MAX_JOURNAL_BACKLOG


async def test_a_block_boundary_sees_every_earlier_block_published(served):
    rt, bus = served
    bus.gate.clear()
    running = asyncio.create_task(rt.advance("o", 4))
    await until(lambda: rt.info("o").blocks_done == 4, "the blocks did not run")
    held = asyncio.create_task(_hold(rt, "o", bus))
    await until(lambda: rt.sessions.get("o").holds > 0, "no hold was taken")
    assert not held.done() and bus.blocks == []  # the hold waits for the output, not only the block
    bus.gate.set()
    assert await held == [1, 2, 3, 4]
    await running


async def _hold(rt: EngineRuntime, sid: str, bus: GatedBus) -> list[int]:
    async with rt.block_boundary(sid):
        return list(bus.blocks)


async def test_a_journal_attached_later_publishes_after_the_outbox_is_drained(served, nc):
    rt, bus = served
    js = nc.jetstream()
    await session_log.provision(js)
    bus.gate.clear()
    early = asyncio.create_task(rt.advance("o", 3))  # unfenced blocks whose output is stuck in the outbox
    await until(lambda: rt.info("o").blocks_done == 3, "the unfenced blocks did not run")
    rt.gate("o")
    writer, _ = await BlockJournal.take(js, "o", Owner(server_id="h1", version=1))
    rt.attach_journal("o", writer)
    rt.ungate("o")
    late = asyncio.create_task(rt.advance("o", 3))  # journaled blocks: recorded, then published
    await until(lambda: rt.info("o").blocks_done == 6, "the journaled blocks did not run")
    bus.gate.set()
    await asyncio.gather(early, late)
    await rt.sessions.get("o").journal.flushed()
    assert bus.blocks == [1, 2, 3, 4, 5, 6]
