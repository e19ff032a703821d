"""The input stream (`SF_INPUT`, subject `sf.input.<sid>`): ingress appends, the gateway reads.

Item seqs are gap-free per session. Ingress assigns the next seq and appends with
a compare-and-set on the subject's last stream sequence, so two ingress instances
can never store two items with one seq. Reads find an item's stream position by
binary search over `next_by_subj` (item seq rises with stream seq).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import nats.errors
import nats.js.errors
from nats.js import JetStreamContext

from libs import bus, errors
from libs.fence import log
from libs.schemas.base import decode, encode
from libs.schemas.common import InputItem

MAX_CAS_ATTEMPTS = 32


@dataclass(slots=True)
class _InputTail:
    item_seq: int = 0  # last stored item seq
    stream_seq: int = 0  # its stream sequence (0 = no item yet)


class InputAppender:
    """Assigns item seqs and stores items durably; one lock per session keeps its cache exact."""

    def __init__(self, js: JetStreamContext) -> None:
        self.js = js
        self._tails: dict[str, _InputTail] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    def last_seq(self, session_id: str) -> int | None:
        tail = self._tails.get(session_id)
        return tail.item_seq if tail else None

    async def append(self, session_id: str, kind: str, data: bytes, accepted_at: float) -> InputItem:
        lock = self._locks.setdefault(session_id, asyncio.Lock())
        async with lock:
            tail = self._tails.get(session_id) or await self._read_tail(session_id)
            for _ in range(MAX_CAS_ATTEMPTS):
                item = InputItem(session_id=session_id, seq=tail.item_seq + 1, kind=kind, data=data,
                                 accepted_at=accepted_at)
                try:
                    ack = await self.js.publish(log.input_subject(session_id), encode(item),
                                                headers={log.EXPECTED_LAST_SUBJECT_SEQ: str(tail.stream_seq)})
                except nats.js.errors.APIError as e:
                    if e.err_code != bus.JS_WRONG_LAST_SEQUENCE:
                        raise errors.Unavailable(f"input store refused: {e.description}") from None
                    tail = await self._read_tail(session_id)  # another ingress stored one: take the next seq
                    continue
                except (nats.errors.TimeoutError, nats.errors.NoRespondersError,
                        nats.js.errors.NoStreamResponseError):
                    self._tails.pop(session_id, None)  # it may have landed: re-read before the next one
                    raise errors.Unavailable("input store unanswered; retry", session_id=session_id) from None
                self._tails[session_id] = _InputTail(item.seq, ack.seq)
                return item
            raise errors.Busy("too much contention on this session's input", session_id=session_id)

    async def _read_tail(self, session_id: str) -> _InputTail:
        try:
            raw = await self.js.get_last_msg(log.INPUT_STREAM, log.input_subject(session_id), direct=True)
        except nats.js.errors.NotFoundError:
            return _InputTail()
        return _InputTail(decode(raw.data, InputItem).seq, raw.seq)

    def forget(self, session_id: str) -> None:
        self._tails.pop(session_id, None)
        self._locks.pop(session_id, None)


async def _next_from(js: JetStreamContext, session_id: str, pos: int) -> tuple[InputItem, int] | None:
    """The session's first stored item at stream sequence ≥ `pos`, with its stream sequence."""
    try:
        raw = await js.get_msg(log.INPUT_STREAM, seq=pos, subject=log.input_subject(session_id),
                               next=True, direct=True)
    except nats.js.errors.NotFoundError:
        return None
    return decode(raw.data, InputItem), raw.seq


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
        if found is None or found[0].seq >= item_seq:
            hi = mid
        else:
            lo = found[1] + 1
    return lo


async def read_items(js: JetStreamContext, session_id: str, after: int, pos: int, *, max_items: int,
                     max_bytes: int) -> list[tuple[InputItem, int]]:
    """Stored items `after+1, after+2, ...` (stopping at a gap or a limit), with their stream seqs.

    `pos` is the stream sequence of item `after` when known (0 = look it up).
    """
    start = pos + 1 if pos else await locate(js, session_id, after + 1)
    out: list[tuple[InputItem, int]] = []
    size = 0
    while len(out) < max_items and size < max_bytes:
        found = await _next_from(js, session_id, start)
        if found is None:
            break
        item, stream_seq = found
        start = stream_seq + 1
        if item.seq <= after + len(out):
            continue
        if item.seq != after + len(out) + 1:
            break
        out.append(found)
        size += len(item.data)
    return out
