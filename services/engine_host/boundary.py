"""Block boundaries: holding a session between blocks, so its state tree is stable.

At most one block of a session is in flight; while a hold is on none is, so the tree is what the
mover copies, suspend offloads and a checkpoint snapshots. Holds nest; the scheduler pauses the
session from the first hold to the last release. A block that does not come from the scheduler (a
regenerated one, exact recovery) waits for `clear` instead: a pause alone does not stop it, and a
checkpoint that read the tree while such a block wrote it was torn (its state one block, its
descriptor another), so every later replay from it differed.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from services.engine_host.scheduler import EdfScheduler
from services.engine_host.session import Session


class Boundaries:
    def __init__(self, sched: EdfScheduler, clock: Callable[[], float], wake: Callable[[], None]) -> None:
        self.sched = sched
        self.clock = clock
        self.wake = wake
        self._holding: dict[str, int] = {}  # sid → `hold` contexts open on it now
        self._free: dict[str, asyncio.Event] = {}  # sid → set when its last hold ends

    @asynccontextmanager
    async def hold(self, s: Session) -> AsyncIterator[None]:
        """While held, no block of `s` runs (the one in flight, if any, finishes first) and every
        finished block's output is out (its outbox or journal is flushed), so a copy or a
        checkpoint taken now never holds a block whose record could still be lost."""
        self.gate(s)
        self._holding[s.sid] = self._holding.get(s.sid, 0) + 1
        self._free.setdefault(s.sid, asyncio.Event()).clear()
        try:
            await s.idle.wait()
            if s.outbox is not None:
                await s.outbox.flushed()
            if s.journal is not None:
                await s.journal.flushed()
                await s.journal.close_window()
            yield
        finally:
            self._release(s.sid)
            self.ungate(s)

    def _release(self, sid: str) -> None:
        n = self._holding.pop(sid) - 1
        if n:
            self._holding[sid] = n
        else:
            self._free.pop(sid).set()

    async def clear(self, s: Session) -> None:
        """Return once `s` has no block in flight and no hold open. A block the caller starts before its
        next await then runs on a tree no holder reads (a holder waits for that block, as for any)."""
        while True:
            await s.idle.wait()
            free = self._free.get(s.sid)
            if free is None:
                return
            await free.wait()

    def gate(self, s: Session) -> None:
        """Schedule no new block of `s` until `ungate` (a hold that does not wait for the block in flight)."""
        s.holds += 1
        if s.holds == 1:
            s.held_at = self.clock()
        if s.sid in self.sched.tasks:
            self.sched.pause(s.sid, True, self.clock())

    def ungate(self, s: Session) -> None:
        s.holds -= 1
        if s.holds == 0:
            now = self.clock()
            s.stats.idle_interval(max(s.held_at, s.last_end), now, "block_boundary")
            s.last_end = max(s.last_end, now)
            if s.status == "running" and s.sid in self.sched.tasks:
                self.sched.pause(s.sid, False, now)
            self.wake()
