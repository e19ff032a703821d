"""One stage of the pipeline as an actor: a thread and a baton, the only owner of its session slots."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic

import structlog

from libs.errors import Busy
from services.engine_host import torch_threads
from services.engine_host.mailbox import Control, ControlOp, Mailbox
from services.engine_host.work import DropReason, Item, M, P, Stage, Work

log = structlog.get_logger("statefleet.engine_host.actor")


@dataclass
class Slot:
    last_seq: int = -1
    scratch: dict = field(default_factory=dict)


class StageActor(Generic[P, M]):
    """One stage. Its state (the session slots) is touched only by
    the thread holding its `baton`: normally its own thread, which takes a message from the inbox
    only while holding the baton.

    A thread that finishes stage k with its own inbox empty (no other work waiting for it) and
    finds stage k+1 idle with an empty inbox carries the work on through k+1 itself instead of
    waking k+1's thread: a lone session's block crosses all stages on one thread, with its
    caches warm and without thread hand-offs. The baton of k+1 is taken before that of k is let
    go (hand over hand), and only when nothing is queued for k+1, so a session's works still
    enter every stage in order; and under load inboxes are rarely empty, so the stages overlap.

    `epoch_of(sid)` is the session's current epoch in the pipeline (None once it is gone): work of
    any other epoch belongs to a superseded stream and is dropped."""

    def __init__(self, stage: Stage[P, M], inbox: Mailbox[P, M], outbox: Mailbox[P, M], *, max_slots: int,
                 epoch_of: Callable[[str], int | None]) -> None:
        self.stage, self.inbox, self.outbox = stage, inbox, outbox
        self.max_slots = max_slots
        self.epoch_of = epoch_of
        self.slots: dict[str, Slot] = {}
        self.quarantined: list[Slot] = []
        self.baton = threading.Lock()
        self.next: StageActor[P, M] | None = None  # the stage after this one; None for the last
        # daemon: a pipeline that is never shut down must not keep the process from exiting
        self.thread = torch_threads.thread(self._main, name=f"stage-{stage.name}")

    @property
    def name(self) -> str:
        return self.stage.name

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
            if isinstance(msg, Control):
                self._control(msg)
                self.baton.release()
                if msg.op is ControlOp.STOP:
                    return
                continue
            self._carry(msg)

    def _carry(self, work: Work[P, M]) -> None:
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

    def _process(self, work: Work[P, M]) -> None:
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
        # An item that failed in an earlier stage rides on to the sink (which fails its session); the
        # others of a coalesced work still run, so one session's error stays with that session.
        live = [it for it in kept if it.error is None]
        if live:
            part = work if len(live) == len(kept) else Work(items=live, meta=work.meta, key=work.key,
                                                            stage_ms=work.stage_ms)
            t0 = time.perf_counter()  # a stage's time is its compute, what a profile row's quantum means
            try:
                self.stage.run(part)
            except Exception as e:  # the session(s) fail; the actor and the other sessions go on
                for it in live:
                    it.error = e
            finally:
                work.stage_ms[self.stage.name] = (time.perf_counter() - t0) * 1000

    def _admit(self, it: Item[P]) -> DropReason | None:
        """None if the item runs here, else why it is dropped."""
        slot = self.slots.get(it.sid)
        if slot is None:
            return "orphaned"
        if it.epoch != self.epoch_of(it.sid):
            return "stale"
        if it.seq <= slot.last_seq:
            return "duplicate"
        if it.seq != slot.last_seq + 1:
            return "stale"  # a gap: the stream it belonged to was superseded
        slot.last_seq = it.seq
        return None

    def _control(self, msg: Control) -> None:
        match msg.op:
            case ControlOp.STOP:
                _reply(msg, None)
            case ControlOp.OPEN:
                if len(self.slots) >= self.max_slots:
                    _reply(msg, Busy(f"stage {self.stage.name} has no free session slot",
                                     stage=self.stage.name, max_slots=self.max_slots))
                else:
                    self.slots[msg.sid] = Slot()
                    _reply(msg, None)
            case ControlOp.RELEASE:
                _reply(msg, self._release(msg.sid))

    def _release(self, sid: str) -> BaseException | None:
        slot = self.slots.pop(sid, None)
        if slot is None or self.stage.release is None:
            return None
        try:
            self.stage.release(sid, slot.scratch)
        except Exception as e:
            self.quarantined.append(slot)  # partially released: never handed out again
            return e
        return None


def _reply(msg: Control, error: BaseException | None) -> None:
    msg.done.get_loop().call_soon_threadsafe(_settle, msg.done, error)


def _settle(fut: asyncio.Future[None], error: BaseException | None) -> None:
    if fut.done():
        return
    if error is None:
        fut.set_result(None)
    else:
        fut.set_exception(error)
