"""A bounded edge of the stage pipeline, shared by stage threads and the event loop."""

from __future__ import annotations

import asyncio
import enum
import threading
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Generic

from services.engine_host.work import M, P, Work


class ControlOp(enum.Enum):
    OPEN = "open"  # give the session a slot in the stage
    RELEASE = "release"  # free the session's slot
    STOP = "stop"  # end the stage's thread


@dataclass
class Control:
    """A request to a stage's owner; answered by settling `done` on the event loop."""

    op: ControlOp
    sid: str
    done: asyncio.Future[None]


class Mailbox(Generic[P, M]):
    """A bounded edge: at most `capacity` works, kept in per-session FIFOs served round-robin, plus
    an unbounded lane for control messages that its reader takes first. The works' payloads are
    opaque to it: it only queues them by their session key.

    Stage threads block on it (`put`, `wait` + `take`); the event loop awaits it (`put_async` on the
    source edge, `get_async` at the sink) and is woken only when the edge it waits on changes, so a
    work crosses the stage threads without a round trip through the loop per stage. The lock is held
    only for a few deque operations, never across a wait, so the loop never blocks on it for longer.

    Writers on the loop that wait for room get it in arrival order: one that finds room while others
    already wait queues behind them instead of barging in. Each session has at most one submit waiting
    (`StagePipeline.submit`), so arrival order is a round over the sessions, however the loop happens
    to schedule the producers: a session submitting a burst cannot take the room freed for another."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.queues: OrderedDict[str, deque[Work[P, M]]] = OrderedDict()
        self.controls: deque[Control] = deque()
        self.size = 0
        self._cond = threading.Condition()
        self._parked: list[asyncio.Future[None]] = []  # event-loop readers waiting for a change
        self._writers: deque[_Turn] = deque()  # event-loop writers waiting for room, in arrival order

    def put(self, work: Work[P, M]) -> None:
        with self._cond:
            self._cond.wait_for(self._has_room)
            self._append(work)

    def wait(self) -> None:
        """Block until something is queued (without taking it)."""
        with self._cond:
            self._cond.wait_for(self._has_msg)

    def take(self) -> Work[P, M] | Control:
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

    async def put_async(self, work: Work[P, M]) -> None:
        with self._cond:
            if self._has_room() and not self._writers:
                self._append(work)
                return
            turn = _Turn(asyncio.get_running_loop().create_future())
            self._writers.append(turn)
        try:
            while True:
                await turn.fut
                with self._cond:
                    if self._writers[0] is turn and self._has_room():
                        self._writers.popleft()
                        self._append(work)  # wakes the next writer if room is left
                        return
                    turn.fut = asyncio.get_running_loop().create_future()
        except asyncio.CancelledError:  # the work never entered; the next writer may take the room
            with self._cond:
                if turn in self._writers:
                    self._writers.remove(turn)
                self._changed()
            raise

    async def get_work(self) -> Work[P, M]:
        """The next work, on the event loop (the sink's edge, which carries no controls)."""
        while True:
            with self._cond:
                if self.size > 0:
                    msg = self._take()
                    assert isinstance(msg, Work)  # controls go first, and no one sends them here
                    return msg
                parked = self._park()
            await parked

    def put_control(self, msg: Control) -> None:
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

    def _append(self, work: Work[P, M]) -> None:
        self.queues.setdefault(work.key, deque()).append(work)
        self.size += 1
        self._changed()

    def _take(self) -> Work[P, M] | Control:
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

    def _park(self) -> asyncio.Future[None]:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._parked.append(fut)
        return fut

    def _changed(self) -> None:
        self._cond.notify_all()
        for fut in self._parked:
            fut.get_loop().call_soon_threadsafe(_wake, fut)
        self._parked.clear()
        if self._writers and self._has_room():
            head = self._writers[0].fut
            head.get_loop().call_soon_threadsafe(_wake, head)


@dataclass(eq=False)
class _Turn:
    """A writer's place in line; `fut` is replaced each time it is woken without getting in."""

    fut: asyncio.Future[None]


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():  # a waiter cancelled meanwhile is simply gone
        fut.set_result(None)
