"""The source edge's writers on the event loop take freed room in arrival order: a writer that finds
room while others wait queues behind them, and a cancelled writer passes its turn on. This is what
makes the pipeline's round over sessions hold however the loop schedules their producers."""

from __future__ import annotations

import asyncio

from services.engine_host.mailbox import Mailbox
from services.engine_host.work import Work


def work(key: str) -> Work:
    return Work(items=[], meta=None, key=key)


def drain_one(box: Mailbox) -> str:
    taken = box.take()
    assert isinstance(taken, Work)
    return taken.key


async def settle() -> None:
    for _ in range(5):  # wake-ups come by call_soon_threadsafe: a few loop turns deliver them
        await asyncio.sleep(0)


async def test_waiting_writers_get_room_in_arrival_order_and_a_late_writer_does_not_barge():
    box: Mailbox = Mailbox(capacity=1)
    await box.put_async(work("first"))
    entered: list[str] = []

    async def writer(key: str) -> None:
        await box.put_async(work(key))
        entered.append(key)

    waiting = [asyncio.create_task(writer(k)) for k in ("a", "b", "c")]
    await settle()
    assert entered == []  # full: all three wait
    assert drain_one(box) == "first"
    late = asyncio.create_task(writer("late"))  # arrives while the room is promised to "a"
    await settle()
    assert entered == ["a"]
    for expect in ("b", "c", "late"):
        drain_one(box)
        await settle()
        assert entered[-1] == expect, entered
    await asyncio.gather(*waiting, late)
    assert entered == ["a", "b", "c", "late"]


async def test_a_cancelled_waiting_writer_leaves_nothing_behind_and_passes_its_turn_on():
    box: Mailbox = Mailbox(capacity=1)
    await box.put_async(work("first"))
    a = asyncio.create_task(box.put_async(work("a")))
    b = asyncio.create_task(box.put_async(work("b")))
    await settle()
    drain_one(box)  # the room is "a"'s turn
    a.cancel()
    await settle()
    assert a.cancelled() and b.done()
    assert drain_one(box) == "b" and box.empty()
