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
  a thread hand-off per stage (see `_Actor`).
- Every edge is a bounded queue: a slow sink fills the edges, the stage threads block
  on their full outboxes, and then `submit` waits (backpressure); nothing queues
  without limit.
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
import threading
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


def _sink_exited(task: asyncio.Task) -> None:
    """The sink ends only when stopped; any other exit is a bug that would stall the pipeline: say so loudly."""
    if not task.cancelled() and task.exception() is not None:
        log.error("pipeline_sink_died", error=repr(task.exception()))


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
    dropped: list[tuple[Item, str]] = field(default_factory=list)  # (item, counter) left behind by a stage


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
    an unbounded lane for control messages that its reader takes first.

    Stage threads block on it (`put`, `wait` + `take`); the event loop awaits it (`put_async` on the
    source edge, `get_async` at the sink) and is woken only when the edge it waits on changes, so a
    work crosses the stage threads without a round trip through the loop per stage. The lock is held
    only for a few deque operations, never across a wait, so the loop never blocks on it for longer."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.queues: OrderedDict[str, deque[Work]] = OrderedDict()
        self.controls: deque[_Control] = deque()
        self.size = 0
        self._cond = threading.Condition()
        self._parked: list[asyncio.Future] = []  # event-loop readers/writers waiting for a change

    def put(self, work: Work) -> None:
        with self._cond:
            self._cond.wait_for(self._has_room)
            self._append(work)

    def wait(self) -> None:
        """Block until something is queued (without taking it)."""
        with self._cond:
            self._cond.wait_for(self._has_msg)

    def take(self) -> Work | _Control:
        """The next message; only the holder of the reader's baton takes (see `claim`)."""
        with self._cond:
            return self._take()

    def claim(self, baton: threading.Lock) -> bool:
        """Take the reader's `baton` if nothing is queued here and the reader is idle. Checked under
        this edge's lock, so nothing can have been queued ahead of the caller's work."""
        with self._cond:
            return not self._has_msg() and baton.acquire(blocking=False)

    def empty(self) -> bool:
        with self._cond:
            return not self._has_msg()

    async def put_async(self, work: Work) -> None:
        while True:
            with self._cond:
                if self._has_room():
                    self._append(work)
                    return
                parked = self._park()
            await parked  # cancelled here, the work never entered

    async def get_async(self) -> Work | _Control:
        while True:
            with self._cond:
                if self._has_msg():
                    return self._take()
                parked = self._park()
            await parked

    def put_control(self, msg: _Control) -> None:
        with self._cond:
            self.controls.append(msg)
            self._changed()

    def holds(self, sid: str) -> bool:
        with self._cond:
            return bool(self.queues.get(sid))

    # the helpers below run with the condition's lock held

    def _has_room(self) -> bool:
        return self.size < self.capacity

    def _has_msg(self) -> bool:
        return self.size > 0 or bool(self.controls)

    def _append(self, work: Work) -> None:
        self.queues.setdefault(work.key, deque()).append(work)
        self.size += 1
        self._changed()

    def _take(self) -> Work | _Control:
        if self.controls:
            return self.controls.popleft()
        key, q = next(iter(self.queues.items()))
        work = q.popleft()
        self.queues.pop(key)
        if q:
            self.queues[key] = q  # to the back of the round
        self.size -= 1
        self._changed()
        return work

    def _park(self) -> asyncio.Future:
        fut = asyncio.get_running_loop().create_future()
        self._parked.append(fut)
        return fut

    def _changed(self) -> None:
        self._cond.notify_all()
        for fut in self._parked:
            fut.get_loop().call_soon_threadsafe(_wake, fut)
        self._parked.clear()


def _wake(fut: asyncio.Future) -> None:
    if not fut.done():  # a waiter cancelled meanwhile is simply gone
        fut.set_result(None)


def _settle(fut: asyncio.Future, error: BaseException | None) -> None:
    if fut.done():
        return
    if error is None:
        fut.set_result(None)
    else:
        fut.set_exception(error)


class _Actor:
    """One stage. Its state (slots, and the backend state keys its stage owns) is touched only by
    the thread holding its `baton`: normally its own thread, which takes a message from the inbox
    only while holding the baton.

    A thread that finishes stage k with its own inbox empty (no other work waiting for it) and
    finds stage k+1 idle with an empty inbox carries the work on through k+1 itself instead of
    waking k+1's thread: a lone session's block crosses all stages on one thread, with its
    caches warm and without thread hand-offs. The baton of k+1 is taken before that of k is let
    go (hand over hand), and only when nothing is queued for k+1, so a session's works still
    enter every stage in order; and under load inboxes are rarely empty, so the stages overlap."""

    def __init__(self, pipe: Pipeline, stage: Stage, inbox: Mailbox, outbox: Mailbox, max_slots: int) -> None:
        self.pipe, self.stage, self.inbox, self.outbox = pipe, stage, inbox, outbox
        self.max_slots = max_slots
        self.slots: dict[str, _Slot] = {}
        self.quarantined: list[_Slot] = []
        self.baton = threading.Lock()
        self.next: _Actor | None = None  # the stage after this one; None for the last
        # daemon: a pipeline that is never shut down must not keep the process from exiting
        self.thread = torch_threads.thread(self._main, name=f"stage-{stage.name}")

    def _main(self) -> None:
        """Actors end only when stopped; any other exit is a bug that would stall the pipeline: say so loudly."""
        try:
            self._serve()
        except BaseException as e:
            log.error("stage_actor_died", actor=self.stage.name, error=repr(e))
            raise

    def _serve(self) -> None:
        while True:
            self.inbox.wait()
            self.baton.acquire()
            msg = self.inbox.take()
            if isinstance(msg, _Control):
                self._control(msg)
                self.baton.release()
                if msg.op == "stop":
                    return
                continue
            self._carry(msg)

    def _carry(self, work: Work) -> None:
        """Run `work` as this stage (baton held), then on through the following stages while
        they are idle; hand it to the first busy one's inbox (or the sink's edge) and return."""
        actor = self
        while True:
            actor._process(work)
            nxt = actor.next
            if nxt is not None and self.inbox.empty() and nxt.inbox.claim(nxt.baton):
                actor.baton.release()
                actor = nxt
                continue
            actor.outbox.put(work)  # blocks while the next edge is full: backpressure up to `submit`
            actor.baton.release()
            return

    def _process(self, work: Work) -> None:
        """Admit the work's items, then run the stage on them. Dropped items leave the work, but
        the work itself always reaches the sink, which accounts for them on the event loop."""
        kept = []
        for it in work.items:
            reason = self._admit(it)
            if reason is None:
                kept.append(it)
            else:
                work.dropped.append((it, reason))
        work.items = kept
        if kept and all(it.error is None for it in kept):
            t0 = time.perf_counter()  # a stage's time is its compute, what a profile row's quantum means
            try:
                self.stage.run(work)
            except Exception as e:  # the session(s) fail; the actor and the other sessions go on
                for it in kept:
                    it.error = e
            finally:
                work.stage_ms[self.stage.name] = (time.perf_counter() - t0) * 1000

    def _admit(self, it: Item) -> str | None:
        """None if the item runs here, else the counter it is dropped under."""
        slot = self.slots.get(it.sid)
        if slot is None:
            return "orphaned"
        if it.epoch != self.pipe.epochs.get(it.sid):
            return "stale"
        if it.seq <= slot.last_seq:
            return "duplicate"
        if it.seq != slot.last_seq + 1:
            return "stale"  # a gap: the stream it belonged to was superseded
        slot.last_seq = it.seq
        return None

    def _control(self, msg: _Control) -> None:
        if msg.op == "stop":
            self._reply(msg, None)
            return
        if msg.op == "open":
            if len(self.slots) >= self.max_slots:
                self._reply(msg, Busy(f"stage {self.stage.name} has no free session slot",
                                      stage=self.stage.name, max_slots=self.max_slots))
            else:
                self.slots[msg.sid] = _Slot()
                self._reply(msg, None)
            return
        slot = self.slots.pop(msg.sid, None)
        error = None
        if slot is not None and self.stage.release is not None:
            try:
                self.stage.release(msg.sid, slot.scratch)
            except Exception as e:
                self.quarantined.append(slot)  # partially released: never handed out again
                error = e
        self._reply(msg, error)

    def _reply(self, msg: _Control, error: BaseException | None) -> None:
        msg.done.get_loop().call_soon_threadsafe(_settle, msg.done, error)


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
        for a, b in zip(self.actors[:-1], self.actors[1:], strict=True):
            a.next = b
        self.out_edge = edges[-1]
        self._sink_task: asyncio.Task | None = None
        self._drained: dict[str, asyncio.Event] = {}
        self._submitting: set[str] = set()
        self._next_epoch = 0
        self.admitting = True

    @property
    def stage_names(self) -> list[str]:
        return [a.stage.name for a in self.actors]

    def start(self) -> None:
        for a in self.actors:
            a.thread.start()
        self._sink_task = asyncio.create_task(self._sink_loop(), name="stage:sink")
        self._sink_task.add_done_callback(_sink_exited)

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
                await self._release(a, sid)
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
            await self.source.put_async(work)
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
                    await self._release(a, sid)
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

    async def _ask(self, actor: _Actor, op: str, sid: str) -> None:
        done = asyncio.get_running_loop().create_future()
        actor.inbox.put_control(_Control(op, sid, done))
        await done

    async def _release(self, actor: _Actor, sid: str) -> None:
        try:
            await self._ask(actor, "release", sid)
        except Exception:
            self.counters.cleanup_failures += 1  # the actor quarantined the slot
            raise

    def _forget(self, it: Item) -> None:
        n = self.in_flight.get(it.sid)
        if n is None:
            return
        self.in_flight[it.sid] = n - 1
        if n - 1 == 0:
            self._drained[it.sid].set()

    async def _sink_loop(self) -> None:
        while True:
            work = await self.out_edge.get_async()
            assert isinstance(work, Work)  # nothing sends controls to the sink
            items = work.items
            work.items = [it for it in items if self.epochs.get(it.sid) == it.epoch]
            self.counters.stale += len(items) - len(work.items)
            # the stages' drops are counted here, on the loop, so every counter has a single writer
            for _, reason in work.dropped:
                setattr(self.counters, reason, getattr(self.counters, reason) + 1)
            try:
                await self.sink(work)
            finally:
                # dropped and stale ones too: a cancelled close waits for every item to be accounted
                for it in [*items, *(it for it, _ in work.dropped)]:
                    self._forget(it)
