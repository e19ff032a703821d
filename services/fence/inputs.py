"""The input stream (`SF_INPUT`, subject `sf.input.<sid>`): ingress appends, the gateway reads.

Item seqs are gap-free per session. Each message is an `InputBatch` of consecutive items.
Ingress assigns the next seqs and appends with a compare-and-set on the subject's last
stream sequence, so two ingress instances can never store two items with one seq.

Writes are group commits: a session has at most one store in flight per instance, and
the items that arrive meanwhile wait in a queue and go out together in the next store.
One item alone is stored at once (no added latency); a busy session stores its items
in as few writes as its arrival rate allows. Every item is acknowledged only after the
write that holds it is stored.

An item may carry its client's id: a resent item whose id is among the session's last
`dedupe_items` stored ones is answered with the first copy's seq and stored no more
(see dedupe.py).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import structlog

from libs import bus, errors, names
from libs.fence import session_log
from libs.schemas.base import decode, encode
from libs.schemas.common import InputItem
from libs.schemas.fence import InputBatch
from libs.tasks import STOP_TIMEOUT_S, cancel_and_wait
from services.fence.dedupe import RecentIds

OnStored = Callable[[str, list[InputItem], int], None]  # (session, items, their batch's stream seq)
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
    item_id: str
    done: asyncio.Future[Stored]


@dataclass(frozen=True, slots=True)
class Stored:
    """What a submitted item became: its seq, and whether an earlier copy with its id had it."""

    seq: int
    duplicate: bool = False


@dataclass(slots=True)
class _Session:
    tail: _InputTail | None = None  # exact while this instance's writer is the only one storing
    queue: deque[_Waiting] = field(default_factory=deque)
    storing: int = 0  # items in the store in flight
    writer: asyncio.Task | None = None
    ids: RecentIds | None = None  # loaded the first time an item of the session carries an id


class InputAppender:
    """Assigns item seqs and stores items durably; one writer task per busy session keeps its tail exact."""

    def __init__(self, js: bus.JetStream, *, max_group_items: int, max_group_bytes: int,
                 dedupe_items: int = 256, on_stored: OnStored | None = None) -> None:
        self.js = js
        self.dedupe_items = dedupe_items
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

    def submit(self, session_id: str, kind: str, data: bytes, accepted_at: float,
               item_id: str = "") -> asyncio.Future[Stored]:
        """Queue one item for storing; the future resolves once it is stored (or found stored).

        Items of one session are stored in the order they were submitted. Cancelling the future
        before its write starts withdraws the item.
        """
        s = self._sessions.setdefault(session_id, _Session())
        done = asyncio.get_running_loop().create_future()
        s.queue.append(_Waiting(kind, data, accepted_at, item_id, done))
        if s.writer is None:
            s.writer = asyncio.create_task(self._write(session_id, s), name=f"input-writer-{session_id}")
        return done

    async def append(self, session_id: str, kind: str, data: bytes, accepted_at: float,
                     item_id: str = "") -> Stored:
        return await self.submit(session_id, kind, data, accepted_at, item_id)

    async def close(self) -> None:
        """Stop every writer; items not yet stored fail with `Unavailable` (their clients retry)."""
        writers = [s.writer for s in self._sessions.values() if s.writer]
        await cancel_and_wait(writers, timeout_s=STOP_TIMEOUT_S)  # a JetStream publish can lose one cancel

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
                    answers, items, stream_seq = await self._store(session_id, s, group)
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
                if items and self.on_stored:  # first, so the release is on its way before the answers
                    self.on_stored(session_id, items, stream_seq)
                for w, answer in zip(group, answers, strict=True):
                    if not w.done.done():
                        w.done.set_result(answer)
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

    async def _store(self, session_id: str, s: _Session,
                     group: list[_Waiting]) -> tuple[list[Stored], list[InputItem], int]:
        """Number the group after the stored tail and store it with a CAS on that tail.

        Returns an answer per waiting item, the items stored, and their batch's stream seq.
        """
        for _ in range(bus.MAX_CAS_ATTEMPTS):
            if s.tail is None:
                s.tail = await self._read_tail(session_id)
            if s.ids is None and any(w.item_id for w in group):
                s.ids = await RecentIds.load(self.js, session_id, self.dedupe_items, s.tail.item_seq)
            elif s.ids is not None and s.ids.pos < s.tail.stream_seq:
                await s.ids.catch_up(self.js, session_id)  # others stored since: learn their ids first
            answers, batch = self._number(session_id, s, group)
            if not batch.items:
                return answers, [], 0
            try:
                stored_seq = await bus.append(
                    self.js, names.input_subject(session_id), encode(batch),
                    {session_log.EXPECTED_LAST_SUBJECT_SEQ: str(s.tail.stream_seq)}, what="the input store",
                    session_id=session_id)
            except errors.Conflict:
                s.tail = None  # another ingress stored some: take the seqs after them
                continue
            except errors.Unavailable:
                s.tail = None  # it may have landed: re-read before the next one
                raise
            s.tail = _InputTail(batch.items[-1].seq, stored_seq)
            if s.ids is not None:
                s.ids.remember(batch, stored_seq)
            return answers, batch.items, stored_seq
        raise errors.Busy("too much contention on this session's input", session_id=session_id)

    def _number(self, session_id: str, s: _Session, group: list[_Waiting]) -> tuple[list[Stored], InputBatch]:
        """Seqs after the tail for new items; the stored seq for an id already stored (or earlier in the group)."""
        seq = s.tail.item_seq
        answers: list[Stored] = []
        items: list[InputItem] = []
        ids: list[str] = []
        in_group: dict[str, int] = {}
        for w in group:
            known = (in_group.get(w.item_id) or s.ids.get(w.item_id)) if w.item_id else None
            if known is not None:
                answers.append(Stored(known, duplicate=True))
                continue
            seq += 1
            if w.item_id:
                in_group[w.item_id] = seq
            items.append(InputItem(session_id=session_id, seq=seq, kind=w.kind, data=w.data,
                                   accepted_at=w.accepted_at))
            ids.append(w.item_id)
            answers.append(Stored(seq))
        return answers, InputBatch(session_id=session_id, items=items, item_ids=ids if any(ids) else [])

    async def _read_tail(self, session_id: str) -> _InputTail:
        try:
            raw = await bus.last_msg(self.js, names.INPUT_STREAM, names.input_subject(session_id),
                                           what="the input store", session_id=session_id)
        except errors.Timeout:  # ingress answers 503 (retry), as for any store that did not answer
            raise errors.Unavailable("input store unanswered; retry", session_id=session_id) from None
        if raw is None:
            return _InputTail()
        return _InputTail(decode(raw.data or b"", InputBatch).items[-1].seq, raw.seq)


def _fail(done: asyncio.Future, error: Exception) -> None:
    if not done.done():
        done.set_exception(error)
        done.exception()  # retrieved here: a client that went away must not leave an "unretrieved" warning
