"""A fenced session's output gate: a block's output is published only once the block journal says
durably what that block was (which input items it consumed, at which tier), so a replacement can
regenerate exactly what was shown.

The sink hands every finished block here and goes on (the session's next block may run
meanwhile); one task per session makes the waiting blocks' records durable as one journal entry
(group commit: whatever finished while the previous append was in flight), then publishes their
output in block order. Each entry of a periodic session declares the next `quiet_blocks` blocks
quiet: one of them that consumes no item at the last recorded tier is published without an append
of its own (the entry already says what it is, see `libs/fence/replay.py`); any other block is
recorded first. A regenerated block is already in the journal and is only published, marked
replayed. Once an append says a newer owner sealed the journal, this host is fenced: nothing more
is published, and `fenced` is set so the lease stops taking input. (Quiet blocks published before
that, after the seal, are exactly what the new owner regenerates for those indexes.)
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import structlog

from libs.errors import Conflict, StatefleetError
from libs.fence.block_journal import BlockJournal
from libs.schemas.fence import ConsumedBlock
from libs.tasks import STOP_TIMEOUT_S, cancel_and_wait, spawn
from libs.telemetry import counter
from services.engine_host.backends import Output

log = structlog.get_logger("statefleet.engine_host.journal")
_entries = counter("sf_engine_journal_entries_total", "Block journal entries appended")
_blocks = counter("sf_engine_journal_blocks_total", "Blocks recorded in the block journal")

MAX_GROUP = 256  # blocks per journal entry (about 7 bytes each)
RETRY_S = 0.05
# Blocks an entry declares quiet: 25 C1 blocks (1 s). A session whose input pauses appends about once
# a second instead of 25 times; a replacement regenerates up to this many item-less blocks after the
# last record before it serves input (a second of input delay after a failover, at most).
QUIET_BLOCKS = 25

# block, output, replayed, last input seq, release (a C1 block's, for its playout point)
PublishBlock = Callable[[int, Output, bool, int, float | None], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Finished:
    consumed: ConsumedBlock
    output: Output | None
    replayed: bool  # regenerated from the journal: recorded already, published marked
    release: float | None = None  # a C1 block's release: it is published at its playout point


class OutputJournal:
    def __init__(self, writer: BlockJournal, publish: PublishBlock, quiet_blocks: int = QUIET_BLOCKS) -> None:
        self.writer = writer
        self.publish = publish
        self.quiet_blocks = quiet_blocks
        self._quiet: tuple[int, int] = (0, -1)  # (quiet_through, tier) of our last landed entry
        self._last: ConsumedBlock | None = None  # the last block we published
        self.fenced = asyncio.Event()
        self._queue: list[Finished] = []
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._task = spawn(self._run(), name=f"journal:{writer.session_id}", event="journal_task_died")

    @property
    def backlog(self) -> int:
        return len(self._queue)

    def add(self, block: Finished) -> None:
        if self.fenced.is_set():
            return  # a newer owner holds the session: this copy's output goes nowhere
        self._queue.append(block)
        self._idle.clear()
        self._wake.set()

    async def flushed(self) -> None:
        """Every block handed in so far is recorded and published (or dropped, once fenced)."""
        await self._idle.wait()

    async def forget_through(self, block: int) -> None:
        await self.writer.forget_through(block)

    async def close_window(self) -> None:
        """At a block boundary (flushed, no block running): end our open quiet window at the last
        block, so a copy or checkpoint taken now is not followed by item-less blocks this owner never
        ran (a live move's destination would regenerate them before serving input). Best effort: an
        open window only costs that delay."""
        last, (through, _) = self._last, self._quiet
        if last is None or through <= last.block or self.fenced.is_set():
            return
        try:
            await self.writer.append([last], last.block)
        except Conflict as e:
            if e.fields.get("reason") == "fenced":
                self.fenced.set()
        except StatefleetError:
            pass  # unanswered: it may have landed
        # Either way the window may now end at `last`: from here every block is recorded before it goes
        # out (one the journal already covered costs an append; one it did not must not go out unrecorded).
        self._quiet = (last.block, last.tier)

    async def close(self) -> None:
        await cancel_and_wait([self._task], timeout_s=STOP_TIMEOUT_S)  # appends are nats requests
        self._idle.set()

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._queue and not self.fenced.is_set():
                batch, self._queue = self._queue[:MAX_GROUP], self._queue[MAX_GROUP:]
                fresh = [b.consumed for b in batch if not b.replayed]
                if not all(map(self._covered, fresh)) and not await self._durable(fresh):
                    break
                for b in batch:
                    self._last = b.consumed
                    if b.output is not None:
                        await self.publish(b.consumed.block, b.output, b.replayed, b.consumed.last_seq, b.release)
            if self.fenced.is_set():
                self._queue.clear()
            if not self._queue:
                self._idle.set()

    def _covered(self, b: ConsumedBlock) -> bool:
        """Our last landed entry already says what `b` is: in its quiet window, no item, same tier."""
        through, tier = self._quiet
        return b.first_seq > b.last_seq and b.block <= through and b.tier == tier

    async def _durable(self, records: list[ConsumedBlock]) -> bool:
        """Append until it lands (True) or the journal says we are fenced (False)."""
        through = records[-1].block + self.quiet_blocks if self.quiet_blocks else 0
        while True:
            try:
                await self.writer.append(records, through)
                self._quiet = (through, records[-1].tier)
                _entries.add(1)
                _blocks.add(len(records))
                return True
            except Conflict as e:
                if e.fields.get("reason") != "fenced":
                    raise
                log.warning("journal_fenced", session_id=self.writer.session_id, holder=e.fields.get("holder"),
                            holder_version=e.fields.get("holder_version"))
                self.fenced.set()
                return False
            except StatefleetError as e:  # the bus is away: output waits, it is never published unrecorded
                log.warning("journal_append_retry", session_id=self.writer.session_id, code=e.code)
                await asyncio.sleep(RETRY_S)
