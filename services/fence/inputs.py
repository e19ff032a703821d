"""The input stream (`SF_INPUT`, subject `sf.input.<sid>`): ingress appends, the gateway reads.

Item seqs are gap-free per session. Each message is an `InputBatch` of consecutive items.
Ingress assigns the next seqs and appends with a compare-and-set on the subject's last
stream sequence, so two ingress instances can never store two items with one seq.

Writes are group commits: a session has at most one store in flight per instance, and
the items that arrive meanwhile wait in a queue and go out together in the next store.
One item alone is stored at once (no added latency); a busy session stores its items
in as few writes as its arrival rate allows. Every item is acknowledged only after the
write that holds it is stored.

Reads find an item's stream position by binary search over `next_by_subj` (item seqs
rise with stream seq).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import nats.errors
import nats.js.errors
import structlog
from nats.js import JetStreamContext

from libs import bus, errors
from libs.fence import log
from libs.schemas.base import decode, encode
from libs.schemas.common import InputItem
from libs.schemas.fence import InputBatch

MAX_CAS_ATTEMPTS = 32
Stored = Callable[[str, list[InputItem], int], None]  # (session, items, their stream seq)
_log = structlog.get_logger("statefleet.fence.inputs")


@dataclass(slots=True)
class _InputTail:
    item_seq: int = 0  # last stored item seq
    stream_seq: int = 0  # its stream sequence (0 = no item yet)


@dataclass(slots=True)
class _Waiting:
    kind: str
    data: bytes
    accepted_at: float
    done: asyncio.Future[InputItem]


@dataclass(slots=True)
class _Session:
    tail: _InputTail | None = None  # exact while this instance's writer is the only one storing
    queue: deque[_Waiting] = field(default_factory=deque)
    storing: int = 0  # items in the store in flight
    writer: asyncio.Task | None = None


class InputAppender:
    """Assigns item seqs and stores items durably; one writer task per busy session keeps its tail exact."""

    def __init__(self, js: JetStreamContext, *, max_group_items: int, max_group_bytes: int,
                 on_stored: Stored | None = None) -> None:
        self.js = js
        self.max_group_items = max_group_items
        self.max_group_bytes = max_group_bytes
        self.on_stored = on_stored
        self._sessions: dict[str, _Session] = {}

    def last_seq(self, session_id: str) -> int | None:
        s = self._sessions.get(session_id)
        return s.tail.item_seq if s and s.tail else None

    def unstored(self, session_id: str) -> int:
        """Items submitted but not yet stored (queued or in the store in flight)."""
        s = self._sessions.get(session_id)
        return len(s.queue) + s.storing if s else 0

    def submit(self, session_id: str, kind: str, data: bytes, accepted_at: float) -> asyncio.Future[InputItem]:
        """Queue one item for storing; the future resolves to it with its seq once it is stored.

        Items of one session are stored in the order they were submitted. Cancelling the future
        before its write starts withdraws the item.
        """
        s = self._sessions.setdefault(session_id, _Session())
        done = asyncio.get_running_loop().create_future()
        s.queue.append(_Waiting(kind, data, accepted_at, done))
        if s.writer is None:
            s.writer = asyncio.create_task(self._write(session_id, s), name=f"input-writer-{session_id}")
        return done

    async def append(self, session_id: str, kind: str, data: bytes, accepted_at: float) -> InputItem:
        return await self.submit(session_id, kind, data, accepted_at)

    async def close(self) -> None:
        """Stop every writer; items not yet stored fail with `Unavailable` (their clients retry)."""
        writers = [s.writer for s in self._sessions.values() if s.writer]
        for w in writers:
            w.cancel()
        await asyncio.gather(*writers, return_exceptions=True)

    def forget(self, session_id: str) -> None:
        s = self._sessions.get(session_id)
        if s is None:
            return
        s.tail = None
        if s.writer is None:
            del self._sessions[session_id]

    async def _write(self, session_id: str, s: _Session) -> None:
        """The session's one writer: store queued items, a group at a time, until none wait."""
        group: list[_Waiting] = []
        try:
            while s.queue:
                group = self._take(s.queue)
                if not group:
                    continue
                s.storing = len(group)
                try:
                    items, stream_seq = await self._store(session_id, s, group)
                except Exception as e:
                    if not isinstance(e, errors.StatefleetError):
                        _log.warning("input_store_failed", session_id=session_id, error=repr(e))
                        s.tail = None
                        e = errors.Unavailable("input store failed; retry", session_id=session_id)
                    for w in group:
                        _fail(w.done, e)
                    continue
                finally:
                    s.storing = 0
                if self.on_stored:  # first, so the release is on its way before the clients' answers
                    self.on_stored(session_id, items, stream_seq)
                for w, item in zip(group, items, strict=True):
                    if not w.done.done():
                        w.done.set_result(item)
        except asyncio.CancelledError:
            stopped = errors.Unavailable("ingress is stopping; retry", session_id=session_id)
            for w in (*group, *s.queue):
                _fail(w.done, stopped)
            s.queue.clear()
            s.tail = None  # a cancelled write may have landed
            raise
        finally:
            s.writer = None

    def _take(self, queue: deque[_Waiting]) -> list[_Waiting]:
        """The next group: up to the item and byte limits, skipping withdrawn items; at least one item."""
        group: list[_Waiting] = []
        size = 0
        while queue and len(group) < self.max_group_items:
            w = queue[0]
            if w.done.done():  # withdrawn (its client went away) before it was stored
                queue.popleft()
                continue
            if group and size + len(w.data) > self.max_group_bytes:
                break
            group.append(queue.popleft())
            size += len(w.data)
        return group

    async def _store(self, session_id: str, s: _Session, group: list[_Waiting]) -> tuple[list[InputItem], int]:
        for _ in range(MAX_CAS_ATTEMPTS):
            tail = s.tail or await self._read_tail(session_id)
            items = [InputItem(session_id=session_id, seq=tail.item_seq + 1 + i, kind=w.kind, data=w.data,
                               accepted_at=w.accepted_at) for i, w in enumerate(group)]
            try:
                ack = await self.js.publish(log.input_subject(session_id),
                                            encode(InputBatch(session_id=session_id, items=items)),
                                            headers={log.EXPECTED_LAST_SUBJECT_SEQ: str(tail.stream_seq)})
            except nats.js.errors.APIError as e:
                if e.err_code != bus.JS_WRONG_LAST_SEQUENCE:
                    raise errors.Unavailable(f"input store refused: {e.description}") from None
                s.tail = None  # another ingress stored some: take the seqs after them
                continue
            except (nats.errors.TimeoutError, nats.errors.NoRespondersError,
                    nats.js.errors.NoStreamResponseError):
                s.tail = None  # it may have landed: re-read before the next one
                raise errors.Unavailable("input store unanswered; retry", session_id=session_id) from None
            s.tail = _InputTail(items[-1].seq, ack.seq)
            return items, ack.seq
        raise errors.Busy("too much contention on this session's input", session_id=session_id)

    async def _read_tail(self, session_id: str) -> _InputTail:
        try:
            raw = await self.js.get_last_msg(log.INPUT_STREAM, log.input_subject(session_id), direct=True)
        except nats.js.errors.NotFoundError:
            return _InputTail()
        except nats.errors.TimeoutError:
            raise errors.Unavailable("input store unanswered; retry", session_id=session_id) from None
        return _InputTail(decode(raw.data, InputBatch).items[-1].seq, raw.seq)


def _fail(done: asyncio.Future, error: Exception) -> None:
    if not done.done():
        done.set_exception(error)
        done.exception()  # retrieved here: a client that went away must not leave an "unretrieved" warning


async def _next_from(js: JetStreamContext, session_id: str, pos: int) -> tuple[InputBatch, int] | None:
    """The session's first stored batch at stream sequence ≥ `pos`, with its stream sequence."""
    try:
        raw = await js.get_msg(log.INPUT_STREAM, seq=pos, subject=log.input_subject(session_id),
                               next=True, direct=True)
    except nats.js.errors.NotFoundError:
        return None
    return decode(raw.data, InputBatch), raw.seq


async def locate(js: JetStreamContext, session_id: str, item_seq: int) -> int:
    """The stream sequence to read from to find item `item_seq` (binary search; 1 if unknown)."""
    lo, hi = 1, None
    try:
        raw = await js.get_last_msg(log.INPUT_STREAM, log.input_subject(session_id), direct=True)
        hi = raw.seq
    except nats.js.errors.NotFoundError:
        return 1
    while lo < hi:
        mid = (lo + hi) // 2
        found = await _next_from(js, session_id, mid)
        if found is None or found[0].items[-1].seq >= item_seq:
            hi = mid
        else:
            lo = found[1] + 1
    return lo


async def read_items(js: JetStreamContext, session_id: str, after: int, pos: int, *, max_items: int,
                     max_bytes: int) -> list[tuple[InputItem, int]]:
    """Stored items `after+1, after+2, ...` (stopping at a gap or a limit), each with its batch's stream seq.

    `pos` is the stream sequence of the batch holding item `after` when known (0 = look it up);
    that batch may hold the items after it too, so reading starts there.
    """
    start = pos or await locate(js, session_id, after + 1)
    out: list[tuple[InputItem, int]] = []
    size = 0
    while len(out) < max_items and size < max_bytes:
        found = await _next_from(js, session_id, start)
        if found is None:
            break
        batch, stream_seq = found
        start = stream_seq + 1
        for item in batch.items:
            if item.seq <= after + len(out):
                continue
            if item.seq != after + len(out) + 1 or len(out) >= max_items or size >= max_bytes:
                return out
            out.append((item, stream_seq))
            size += len(item.data)
    return out
