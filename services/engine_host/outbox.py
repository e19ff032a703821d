"""An unfenced session's output, published in block order by one task of its own.

A fenced session's journal task already takes its output off the block's critical path (journal.py);
this gives a session without a journal the same shape, minus the record: the sink queues a finished
block here and the session's next block runs while this one's frames are encoded (in a worker
thread) and published. Before it, the sink awaited that encode inline, and every block paid it plus
two thread hand-offs (docs/bench-engine.md).

`flushed` is what a block boundary (boundary.py) and `advance` wait on, so a copy, a checkpoint or
a caller that sees a block as done also sees its output out. The queue is bounded by the sink
(`MAX_JOURNAL_BACKLOG`), as the journal's is.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from libs.tasks import STOP_TIMEOUT_S, cancel_and_wait, spawn
from services.engine_host.backends import Output

# block, output, replayed, last input seq, release (always None here: only a journal paces, playout.py)
PublishBlock = Callable[[int, Output, bool, int, float | None], Awaitable[None]]


class Outbox:
    def __init__(self, sid: str, publish: PublishBlock) -> None:
        self.publish = publish
        self._queue: list[tuple[int, Output, int]] = []  # (block, output, last input seq)
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._task = spawn(self._run(), name=f"outbox:{sid}", event="outbox_task_died")

    @property
    def backlog(self) -> int:
        return len(self._queue)

    def add(self, block: int, output: Output, input_seq: int) -> None:
        self._queue.append((block, output, input_seq))
        self._idle.clear()
        self._wake.set()

    async def flushed(self) -> None:
        """Every block handed in so far is published (or dropped by the bus and counted, sink.py)."""
        await self._idle.wait()

    async def close(self) -> None:
        await cancel_and_wait([self._task], timeout_s=STOP_TIMEOUT_S)
        self._queue.clear()
        self._idle.set()

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._queue:
                block, output, input_seq = self._queue[0]
                await self.publish(block, output, False, input_seq, None)
                self._queue.pop(0)
            self._idle.set()
