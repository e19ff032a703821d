"""The streaming stage pipeline: stage actors with one owner each, bounded edges, strict per-session order.

    submit ─▶ [fair source edge] ─▶ stage 1 ─▶ [edge] ─▶ … ─▶ stage n ─▶ [edge] ─▶ sink

- Each stage is an actor: one asyncio task that alone reads its inbox, alone holds
  its per-session slots, and runs its work on its own single thread (torch releases
  the GIL, so stages of different sessions overlap).
- Every edge is a bounded queue: a slow sink fills the edges and then `submit`
  waits (backpressure); nothing queues without limit.
- The source edge keeps one FIFO per session and hands them out round-robin, so a
  session with a burst cannot starve the others; every stage checks that a
  session's `seq` arrives exactly one after the last it saw.
- A session is closed in order: stop admitting → drain (or cancel: later work is
  dropped as stale) → each stage releases its slot through its own inbox, last stage
  first → verify no slot or in-flight work is left. Release failures are counted
  and the slot is quarantined, never reused.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import structlog

from libs.errors import Busy, Conflict, Internal, NotFound
from libs.schemas.engine import PipelineCounters
from services.engine_host import torch_threads

log = structlog.get_logger("statefleet.engine_host.pipeline")


def _actor_exited(task: asyncio.Task) -> None:
    """Actors end only when stopped; any other exit is a bug that would stall the pipeline: say so loudly."""
    if not task.cancelled() and task.exception() is not None:
        log.error("stage_actor_died", actor=task.get_name(), error=repr(task.exception()))


@dataclass
class Item:
    """One session's block inside a unit of work."""

    sid: str
    seq: int
    epoch: int
    data: Any
    error: BaseException | None = None


@dataclass
class Work:
    """A unit the stages process together: one block, or a coalesced batch of several sessions' blocks."""

    items: list[Item]
    meta: Any = None
    key: str = ""  # the session whose FIFO carries it on every edge (the lead of a batch)
    stage_ms: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Stage:
    name: str
    run: Callable[[Work], None]  # runs on the stage's thread; reads/writes item.data
    release: Callable[[str, dict], None] | None = None  # frees a session's stage slot (on the stage's thread)


@dataclass
class _Slot:
    last_seq: int = -1
    scratch: dict = field(default_factory=dict)


@dataclass
class _Control:
    op: str  # "open" | "release" | "stop"
    sid: str
    done: asyncio.Future


class Mailbox:
    """A bounded edge: at most `capacity` works, kept in per-session FIFOs served round-robin, plus
    an unbounded lane for control messages that its actor reads first."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.queues: OrderedDict[str, deque[Work]] = OrderedDict()
        self.controls: deque[_Control] = deque()
        self.size = 0
        self._changed = asyncio.Condition()

    async def put(self, work: Work) -> None:
        async with self._changed:
            await self._changed.wait_for(lambda: self.size < self.capacity)
            self.queues.setdefault(work.key, deque()).append(work)
            self.size += 1
            self._changed.notify_all()

    async def put_control(self, msg: _Control) -> None:
        async with self._changed:
            self.controls.append(msg)
            self._changed.notify_all()

    async def get(self) -> Work | _Control:
        async with self._changed:
            await self._changed.wait_for(lambda: self.size > 0 or self.controls)
            if self.controls:
                return self.controls.popleft()
            key, q = next(iter(self.queues.items()))
            work = q.popleft()
            self.queues.pop(key)
            if q:
                self.queues[key] = q  # to the back of the round
            self.size -= 1
            self._changed.notify_all()
            return work

    def holds(self, sid: str) -> bool:
        return bool(self.queues.get(sid))


class _Actor:
    def __init__(self, pipe: Pipeline, stage: Stage, inbox: Mailbox, outbox: Mailbox, max_slots: int) -> None:
        self.pipe, self.stage, self.inbox, self.outbox = pipe, stage, inbox, outbox
        self.max_slots = max_slots
        self.slots: dict[str, _Slot] = {}
        self.quarantined: list[_Slot] = []
        self.thread = torch_threads.executor(f"stage-{stage.name}")

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            msg = await self.inbox.get()
            if isinstance(msg, _Control):
                if msg.op == "stop":
                    msg.done.set_result(None)
                    return
                await self._control(msg, loop)
                continue
            # Dropped items leave the work, but the work itself always reaches the sink, which
            # is where its dispatcher learns it is over.
            msg.items = [it for it in msg.items if self._admit(it)]
            if msg.items and all(it.error is None for it in msg.items):
                try:
                    await loop.run_in_executor(self.thread, self._timed_run, msg)
                except Exception as e:  # the session(s) fail; the actor and the other sessions go on
                    for it in msg.items:
                        it.error = e
            await self.outbox.put(msg)

    def _timed_run(self, msg: Work) -> None:
        """Run the stage, timed on its own thread: a stage's time is its compute (what a profile
        row's quantum means), not the hand-off to and from the event loop."""
        t0 = time.perf_counter()
        try:
            self.stage.run(msg)
        finally:
            msg.stage_ms[self.stage.name] = (time.perf_counter() - t0) * 1000

    def _admit(self, it: Item) -> bool:
        pipe = self.pipe
        slot = self.slots.get(it.sid)
        if slot is None:
            pipe.counters.orphaned += 1
            pipe._forget(it)
            return False
        if it.epoch != pipe.epochs.get(it.sid):
            pipe.counters.stale += 1
            pipe._forget(it)
            return False
        if it.seq <= slot.last_seq:
            pipe.counters.duplicate += 1
            pipe._forget(it)
            return False
        if it.seq != slot.last_seq + 1:
            pipe.counters.stale += 1  # a gap: the stream it belonged to was superseded
            pipe._forget(it)
            return False
        slot.last_seq = it.seq
        return True

    async def _control(self, msg: _Control, loop: asyncio.AbstractEventLoop) -> None:
        if msg.op == "open":
            if len(self.slots) >= self.max_slots:
                msg.done.set_exception(Busy(f"stage {self.stage.name} has no free session slot",
                                            stage=self.stage.name, max_slots=self.max_slots))
            else:
                self.slots[msg.sid] = _Slot()
                msg.done.set_result(None)
            return
        slot = self.slots.pop(msg.sid, None)
        if slot is None:
            msg.done.set_result(None)
            return
        try:
            if self.stage.release is not None:
                await loop.run_in_executor(self.thread, self.stage.release, msg.sid, slot.scratch)
            msg.done.set_result(None)
        except Exception as e:
            self.pipe.counters.cleanup_failures += 1
            self.quarantined.append(slot)  # partially released: never handed out again
            msg.done.set_exception(e)


class Pipeline:
    def __init__(self, stages: list[Stage], sink: Callable[[Work], Awaitable[None]], *,
                 edge_capacity: int = 2, max_sessions: int = 64) -> None:
        if not stages:
            raise ValueError("a pipeline needs at least one stage")
        self.counters = PipelineCounters()
        self.epochs: dict[str, int] = {}
        self.in_flight: dict[str, int] = {}
        self.closing: set[str] = set()
        self.sink = sink
        edges = [Mailbox(edge_capacity) for _ in range(len(stages) + 1)]
        self.source = edges[0]
        inboxes, outboxes = edges[:-1], edges[1:]
        self.actors = [_Actor(self, s, inbox, out, max_sessions) for s, inbox, out in zip(stages, inboxes, outboxes, strict=True)]
        self.out_edge = edges[-1]
        self._tasks: list[asyncio.Task] = []
        self._drained: dict[str, asyncio.Event] = {}
        self._submitting: set[str] = set()
        self._next_epoch = 0
        self.admitting = True

    @property
    def stage_names(self) -> list[str]:
        return [a.stage.name for a in self.actors]

    def start(self) -> None:
        self._tasks = [asyncio.create_task(a.run(), name=f"stage:{a.stage.name}") for a in self.actors]
        self._tasks.append(asyncio.create_task(self._sink_loop(), name="stage:sink"))
        for t in self._tasks:
            t.add_done_callback(_actor_exited)

    # ------------------------------------------------------------ sessions

    async def open(self, sid: str) -> None:
        if sid in self.epochs:
            raise Conflict(f"session {sid} is already open in the pipeline", session_id=sid)
        if not self.admitting:
            raise Conflict("the pipeline is shutting down", session_id=sid)
        opened = []
        try:
            for a in self.actors:
                await self._ask(a, "open", sid)
                opened.append(a)
        except Exception:
            for a in reversed(opened):
                await self._ask(a, "release", sid)
            raise
        self._next_epoch += 1
        self.epochs[sid] = self._next_epoch
        self.in_flight[sid] = 0
        self._drained[sid] = asyncio.Event()
        self._drained[sid].set()

    async def submit(self, work: Work) -> None:
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

    async def _enter(self, work: Work) -> None:
        work.key = work.items[0].sid
        for it in work.items:
            it.epoch = self.epochs[it.sid]
            self.in_flight[it.sid] += 1
            self._drained[it.sid].clear()
        try:
            await self.source.put(work)
        except BaseException:  # cancelled while waiting for room: it never entered, so it is not in flight
            for it in work.items:
                self._forget(it)
            raise

    async def close(self, sid: str, *, drain: bool = True) -> None:
        """Ordered shutdown of one session; raises Internal if a slot or work of it is left behind."""
        if sid not in self.epochs:
            raise NotFound(f"session {sid} is not open in the pipeline", session_id=sid)
        self.closing.add(sid)
        try:
            if not drain:
                # Everything of it still queued is now stale: the next actor drops it (and its work,
                # possibly shared with other sessions in a batch, flows on to the sink).
                self.epochs[sid] = -1
            await self._drained[sid].wait()
            failures = []
            for a in reversed(self.actors):
                try:
                    await self._ask(a, "release", sid)
                except Exception as e:
                    failures.append(f"{a.stage.name}: {e!r}")
            self._verify_released(sid)
            if failures:
                raise Internal(f"session {sid} cleanup failed in {failures}", session_id=sid)
        finally:
            self.closing.discard(sid)
            self.epochs.pop(sid, None)
            self.in_flight.pop(sid, None)
            self._drained.pop(sid, None)

    def _verify_released(self, sid: str) -> None:
        leaks = [a.stage.name for a in self.actors if sid in a.slots]
        if leaks or self.in_flight.get(sid) or self.source.holds(sid):
            self.counters.slot_leaks += 1
            raise Internal(f"session {sid} still holds slots in {leaks}", session_id=sid, stages=",".join(leaks))

    async def shutdown(self, *, drain: bool = True) -> None:
        """Stop admitting, close every session in order, then stop the actors first to last."""
        self.admitting = False
        errors = []
        for sid in list(self.epochs):
            try:
                await self.close(sid, drain=drain)
            except Exception as e:
                errors.append(e)
        for a in self.actors:
            await self._ask(a, "stop", "")
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for a in self.actors:
            a.thread.shutdown(wait=True)
            if a.slots:
                self.counters.slot_leaks += len(a.slots)
        if errors:
            raise errors[0]

    # ------------------------------------------------------------ internals

    async def _ask(self, actor: _Actor, op: str, sid: str) -> None:
        done = asyncio.get_running_loop().create_future()
        await actor.inbox.put_control(_Control(op, sid, done))
        await done

    def _forget(self, it: Item) -> None:
        n = self.in_flight.get(it.sid)
        if n is None:
            return
        self.in_flight[it.sid] = n - 1
        if n - 1 == 0:
            self._drained[it.sid].set()

    async def _sink_loop(self) -> None:
        while True:
            work = await self.out_edge.get()
            assert isinstance(work, Work)  # nothing sends controls to the sink
            items = work.items
            work.items = [it for it in items if self.epochs.get(it.sid) == it.epoch]
            self.counters.stale += len(items) - len(work.items)
            try:
                await self.sink(work)
            finally:
                for it in items:  # stale ones too: a cancelled close waits for every item to be accounted
                    self._forget(it)
