"""The dispatcher: asks the scheduler for the next quantum, takes its sessions' pending inputs into
block jobs and submits them to the stage pipeline; at most `max_in_flight` quanta at once.

A regenerated block (exact recovery) does not come from the scheduler: `submit_exact` runs one
gated session's next block with exactly the items and tier the block journal recorded for it."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable

import structlog

from libs.errors import StatefleetError
from libs.schemas.fence import ConsumedBlock
from libs.session_classes import PERIODIC
from libs.tasks import spawn
from services.engine_host.pipeline import StagePipeline
from services.engine_host.scheduler import Dispatch, EdfScheduler
from services.engine_host.session import Pending, Session, SessionTable
from services.engine_host.stages import BlockJob
from services.engine_host.work import Item, Work

log = structlog.get_logger("statefleet.engine_host.dispatcher")


class Dispatcher:
    def __init__(self, sched: EdfScheduler, sessions: SessionTable, pipeline: StagePipeline[BlockJob, Dispatch], *,
                 max_in_flight: int, clock: Callable[[], float]) -> None:
        self.sched = sched
        self.sessions = sessions
        self.pipeline = pipeline
        self.max_in_flight = max_in_flight
        self.clock = clock
        self.in_flight = 0  # quanta submitted and not yet through the sink
        self._exact: set[int] = set()  # ids of the regenerated blocks' dispatches: no scheduler task ran them
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def wake(self) -> None:
        """Something the scheduler decides on changed: pick again."""
        self._wake.set()

    def start(self) -> None:
        # The dispatcher ends only when stopped; anything else would silently stop every session.
        self._task = spawn(self._loop(), name="engine:dispatch", event="dispatcher_died")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _loop(self) -> None:
        while True:
            self._wake.clear()
            timeout: float | None = None
            if self.in_flight < self.max_in_flight:
                now = self.clock()
                d = self.sched.pick(now)
                if isinstance(d, Dispatch):
                    await self._start(d, now)
                    continue
                timeout = None if math.isinf(d.until) else max(0.0, d.until - now)
            # a timer handle, not wait_for: no task is created per wait on this hot path
            timer = None if timeout is None else asyncio.get_running_loop().call_later(timeout, self._wake.set)
            await self._wake.wait()
            if timer is not None:
                timer.cancel()

    async def _start(self, d: Dispatch, now: float) -> None:
        items = []
        for sid, deadline in zip(d.sids, d.deadlines, strict=True):
            s = self.sessions.lookup(sid)
            assert s is not None  # the scheduler holds a task only for a session in the table
            self._note_wait(s, now, deadline)
            taken = s.take_pending()
            task = self.sched.tasks[sid]
            release = deadline - task.period_s if task.cls == "C1" and math.isfinite(deadline) else None
            # every accepted item is in `taken` or was skipped (refused by the backend, no effect on
            # state), so the block's state reflects the whole input cursor
            items.append(self._item(s, taken, s.input_cursor, d.tier, release=release))
        await self._submit(items, d, now)

    async def submit_exact(self, s: Session, block: ConsumedBlock) -> None:
        """Start `s`'s next block as `block` recorded it: its items exactly, at its tier. The caller
        holds the session out of the scheduler (gated) and has every one of those items accepted."""
        now = self.clock()
        taken = s.take_through(block.last_seq)
        d = Dispatch(sids=(s.sid,), tier=block.tier, start=now, deadlines=(math.inf,))
        self._exact.add(id(d))
        await self._submit([self._item(s, taken, block.last_seq, block.tier, replayed=True)], d, now)

    def _item(self, s: Session, taken: list[Pending], last_seq: int, tier: int, *,
              replayed: bool = False, release: float | None = None) -> Item[BlockJob]:
        seq = s.block_started()
        job = BlockJob(session=s, inputs=[p.parsed for p in taken], last_seq=last_seq,
                       accepted_at=[p.accepted_at for p in taken], tier=tier, replayed=replayed, release=release)
        return Item(sid=s.sid, seq=seq, epoch=0, data=job)

    async def _submit(self, items: list[Item[BlockJob]], d: Dispatch, now: float) -> None:
        self.in_flight += 1
        try:
            await self.pipeline.submit(Work(items=items, meta=d))
        except StatefleetError as e:  # closed between pick and submit: the quantum never started
            log.info("dispatch_dropped", sessions=d.sids, reason=e.detail)
            for it in items:
                it.data.session.block_finished(now)
            self._finish(d, now)
            self.in_flight -= 1

    def _finish(self, d: Dispatch, now: float) -> None:
        if id(d) in self._exact:
            self._exact.discard(id(d))  # the scheduler never picked it: nothing of its to update
        else:
            self.sched.done(d, now)

    def _note_wait(self, s: Session, now: float, deadline: float) -> None:
        """Split the gap since the session's last block into waiting-for-work and waiting-for-device."""
        task = self.sched.tasks[s.sid]
        ready_at = deadline - task.period_s if task.cls in PERIODIC else s.asked_at
        ready_at = min(max(ready_at, s.last_end), now)
        s.stats.idle_interval(s.last_end, ready_at, "waiting_release" if task.cls in PERIODIC else "no_budget")
        s.stats.idle_interval(ready_at, now, "device_busy")

    def quantum_done(self, d: Dispatch) -> None:
        """The sink is through with a quantum: tell the scheduler, count releases it skipped meanwhile."""
        before = {sid: t.skipped for sid in d.sids if (t := self.sched.tasks.get(sid))}
        self._finish(d, self.clock())
        for sid, n in before.items():
            if (s := self.sessions.lookup(sid)) is not None:
                s.stats.skipped(self.sched.tasks[sid].skipped - n)
        self.in_flight -= 1
        self._wake.set()
