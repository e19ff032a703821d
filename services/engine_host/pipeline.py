"""The streaming stage pipeline: stage actors with one owner each, bounded edges, strict per-session order.

    submit ─▶ [fair source edge] ─▶ stage 1 ─▶ [edge] ─▶ … ─▶ stage n ─▶ [edge] ─▶ sink

- Each stage is an actor with its own thread and a baton (a lock): only the baton's
  holder reads its inbox, touches its per-session slots and runs its work, so each
  stage's state has exactly one owner at a time. Stage threads hand works to each
  other directly (torch releases the GIL, so stages of different sessions overlap);
  the event loop only feeds the first edge and drains the last, so a block costs two
  loop wake-ups, not two per stage.
- When nothing else is waiting, the thread that ran stage k takes stage k+1's baton
  and runs it too: a lone session's block crosses every stage on one thread, without
  a thread hand-off per stage (see `actor.StageActor`).
- Every edge is a bounded queue: a slow sink fills the edges, the stage threads block
  on their full outboxes, and then `submit` waits (backpressure); nothing queues
  without limit.
- The source edge keeps one FIFO per session and hands them out round-robin, so a
  session with a burst cannot starve the others; every stage checks that a
  session's `seq` arrives exactly one after the last it saw.
- A session is closed in order: stop admitting → finish (or cancel: later work is
  dropped as stale) → each stage releases its slot through its own inbox, last stage
  first → verify no slot or in-flight work is left. Release failures are counted
  and the slot is quarantined, never reused.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic

from libs.errors import Conflict, Internal, NotFound
from libs.schemas.engine import PipelineCounters
from libs.tasks import spawn
from services.engine_host.actor import StageActor
from services.engine_host.mailbox import Control, ControlOp, Mailbox
from services.engine_host.work import DropReason, Item, M, P, Stage, Work


class StagePipeline(Generic[P, M]):
    """The stages as actors joined by mailboxes, fed by `submit` and drained into `sink` (see the module doc)."""

    def __init__(self, stages: list[Stage[P, M]], sink: Callable[[Work[P, M]], Awaitable[None]], *,
                 edge_capacity: int = 2, max_sessions: int = 64) -> None:
        if not stages:
            raise ValueError("a pipeline needs at least one stage")
        self.counters = PipelineCounters()
        self.epochs: dict[str, int] = {}
        self.in_flight: dict[str, int] = {}
        self.closing: set[str] = set()
        self.sink = sink
        edges: list[Mailbox[P, M]] = [Mailbox(edge_capacity) for _ in range(len(stages) + 1)]
        self.source = edges[0]
        inboxes, outboxes = edges[:-1], edges[1:]
        self.actors = [StageActor(s, inbox, out, max_slots=max_sessions, epoch_of=self.epochs.get)
                       for s, inbox, out in zip(stages, inboxes, outboxes, strict=True)]
        for a, b in zip(self.actors[:-1], self.actors[1:], strict=True):
            a.next = b
        self.out_edge = edges[-1]
        self._sink_task: asyncio.Task | None = None
        self._idle: dict[str, asyncio.Event] = {}
        self._submitting: set[str] = set()
        self._next_epoch = 0
        self.admitting = True

    def start(self) -> None:
        for a in self.actors:
            a.thread.start()
        # The sink ends only when stopped; any other exit would stall the pipeline: say so loudly.
        self._sink_task = spawn(self._sink_loop(), name="stage:sink", event="pipeline_sink_died")

    # ------------------------------------------------------------ sessions

    async def open(self, sid: str) -> None:
        if sid in self.epochs:
            raise Conflict(f"session {sid} is already open in the pipeline", session_id=sid)
        if not self.admitting:
            raise Conflict("the pipeline is shutting down", session_id=sid)
        opened = []
        try:
            for a in self.actors:
                await self._ask(a, ControlOp.OPEN, sid)
                opened.append(a)
        except Exception:
            for a in reversed(opened):
                await self._release(a, sid)
            raise
        self._next_epoch += 1
        self.epochs[sid] = self._next_epoch
        self.in_flight[sid] = 0
        self._idle[sid] = asyncio.Event()
        self._idle[sid].set()

    async def submit(self, work: Work[P, M]) -> None:
        """Queue one unit; waits while the source edge is full (backpressure). A session's units are
        submitted one after another (each awaited): two waiting at once could be let in out of order,
        so a second concurrent submit for a session is refused."""
        for it in work.items:
            if it.sid not in self.epochs:
                raise NotFound(f"session {it.sid} is not open in the pipeline", session_id=it.sid)
            if it.sid in self.closing or not self.admitting:
                raise Conflict(f"session {it.sid} is closing", session_id=it.sid)
            if it.sid in self._submitting:
                raise Conflict(f"session {it.sid} already has a submit waiting", session_id=it.sid)
        sids = {it.sid for it in work.items}
        self._submitting |= sids
        try:
            await self._enter(work)
        finally:
            self._submitting -= sids

    async def _enter(self, work: Work[P, M]) -> None:
        work.key = work.items[0].sid
        for it in work.items:
            it.epoch = self.epochs[it.sid]
            self.in_flight[it.sid] += 1
            self._idle[it.sid].clear()
        try:
            await self.source.put_async(work)
        except BaseException:  # cancelled while waiting for room: it never entered, so it is not in flight
            for it in work.items:
                self._forget(it)
            raise

    async def close(self, sid: str, *, finish: bool = True) -> None:
        """Ordered shutdown of one session; raises Internal if a slot or work of it is left behind."""
        if sid not in self.epochs:
            raise NotFound(f"session {sid} is not open in the pipeline", session_id=sid)
        self.closing.add(sid)
        try:
            if not finish:
                # Everything of it still queued is now stale: the next actor drops it (and its work,
                # possibly shared with other sessions in a batch, flows on to the sink).
                self.epochs[sid] = -1
            await self._idle[sid].wait()
            failures = []
            for a in reversed(self.actors):
                try:
                    await self._release(a, sid)
                except Exception as e:
                    failures.append(f"{a.name}: {e!r}")
            self._verify_released(sid)
            if failures:
                raise Internal(f"session {sid} cleanup failed in {failures}", session_id=sid)
        finally:
            self.closing.discard(sid)
            self.epochs.pop(sid, None)
            self.in_flight.pop(sid, None)
            self._idle.pop(sid, None)

    def _verify_released(self, sid: str) -> None:
        leaks = [a.name for a in self.actors if sid in a.slots]
        if leaks or self.in_flight.get(sid) or self.source.holds(sid):
            self.counters.slot_leaks += 1
            raise Internal(f"session {sid} still holds slots in {leaks}", session_id=sid, stages=",".join(leaks))

    async def shutdown(self, *, finish: bool = True) -> None:
        """Stop admitting, close every session in order, then stop the actors first to last."""
        self.admitting = False
        errors = []
        for sid in list(self.epochs):
            try:
                await self.close(sid, finish=finish)
            except Exception as e:
                errors.append(e)
        for a in self.actors:
            await self._ask(a, ControlOp.STOP, "")
            await asyncio.to_thread(a.thread.join)  # it has answered: this returns at once
        if self._sink_task is not None:
            self._sink_task.cancel()
            await asyncio.gather(self._sink_task, return_exceptions=True)
        for a in self.actors:
            if a.slots:
                self.counters.slot_leaks += len(a.slots)
        if errors:
            raise errors[0]

    # ------------------------------------------------------------ internals

    async def _ask(self, actor: StageActor[P, M], op: ControlOp, sid: str) -> None:
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        actor.inbox.put_control(Control(op, sid, done))
        await done

    async def _release(self, actor: StageActor[P, M], sid: str) -> None:
        try:
            await self._ask(actor, ControlOp.RELEASE, sid)
        except Exception:
            self.counters.cleanup_failures += 1  # the actor quarantined the slot
            raise

    def _count_drop(self, reason: DropReason) -> None:
        c = self.counters
        match reason:
            case "orphaned":
                c.orphaned += 1
            case "stale":
                c.stale += 1
            case "duplicate":
                c.duplicate += 1

    def _forget(self, it: Item[P]) -> None:
        n = self.in_flight.get(it.sid)
        if n is None:
            return
        self.in_flight[it.sid] = n - 1
        if n - 1 == 0:
            self._idle[it.sid].set()

    async def _sink_loop(self) -> None:
        while True:
            work = await self.out_edge.get_work()
            items = work.items
            work.items = [it for it in items if self.epochs.get(it.sid) == it.epoch]
            self.counters.stale += len(items) - len(work.items)
            # the stages' drops are counted here, on the loop, so every counter has a single writer
            for _, reason in work.dropped:
                self._count_drop(reason)
            try:
                await self.sink(work)
            finally:
                # dropped and stale ones too: a cancelled close waits for every item to be accounted
                for it in [*items, *(it for it, _ in work.dropped)]:
                    self._forget(it)
