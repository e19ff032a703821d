"""Reading a session's stored input (`SF_INPUT`, subject `sf.input.<sid>`, `InputBatch` messages).

Item seqs rise with stream seq, so an item's batch is found by binary search over
`next_by_subj` direct gets.
"""

from __future__ import annotations

from libs import bus, names
from libs.schemas.base import decode
from libs.schemas.common import InputItem
from libs.schemas.fence import InputBatch


async def next_batch(js: bus.JetStream, session_id: str, pos: int) -> tuple[InputBatch, int] | None:
    """The session's first stored batch at stream sequence ≥ `pos`, with its stream sequence."""
    raw = await bus.next_msg(js, names.INPUT_STREAM, names.input_subject(session_id), pos,
                                   what="stored input", session_id=session_id)
    return None if raw is None else (decode(raw.data, InputBatch), raw.seq)


async def locate(js: bus.JetStream, session_id: str, item_seq: int) -> int:
    """The stream sequence to read from to find item `item_seq` (binary search; 1 if unknown)."""
    raw = await bus.last_msg(js, names.INPUT_STREAM, names.input_subject(session_id), what="stored input",
                                   session_id=session_id)
    if raw is None:
        return 1
    lo, hi = 1, raw.seq
    while lo < hi:
        mid = (lo + hi) // 2
        found = await next_batch(js, session_id, mid)
        if found is None or found[0].items[-1].seq >= item_seq:
            hi = mid
        else:
            lo = found[1] + 1
    return lo


async def read_items(js: bus.JetStream, session_id: str, after: int, pos: int, *, max_items: int,
                     max_bytes: int) -> list[tuple[InputItem, int]]:
    """Stored items `after+1, after+2, ...` (stopping at a gap or a limit), each with its batch's stream seq.

    `pos` is the stream sequence of the batch holding item `after` when known (0 = look it up);
    that batch may hold the items after it too, so reading starts there.
    """
    start = pos or await locate(js, session_id, after + 1)
    out: list[tuple[InputItem, int]] = []
    size = 0
    while len(out) < max_items and size < max_bytes:
        found = await next_batch(js, session_id, start)
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
