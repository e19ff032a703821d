"""JetStream stream messages: last and next reads, conditional appends, purges, object reads.

- nothing there (no message on the subject, no object) is None, not an error;
- a read the server did not answer in time is `Timeout`;
- an append whose expected last sequence no longer holds is `Conflict` (read again, decide again);
- anything else the bus or the server says (no responders, a leader election, an API error, a lost
  connection), and any failed write, is `Unavailable`: retryable; an append that said so may or may
  not have landed.
`what` names the record for the message (e.g. "the session log"); `fields` go into the error.
"""

from __future__ import annotations

from typing import Any

from libs import errors
from libs.bus import failures
from libs.bus.types import JetStream, ObjectStore, RawStreamMsg


async def last_msg(js: JetStream, stream: str, subject: str, *, what: str,
                   **fields: Any) -> RawStreamMsg | None:
    """The subject's last message in `stream` (None: it has none)."""
    return await failures.unless_missing(js.get_last_msg(stream, subject, direct=True),
                                         lambda e: failures.failed(e, f"reading {what}", **fields))


async def next_msg(js: JetStream, stream: str, subject: str, seq: int, *, what: str,
                   **fields: Any) -> RawStreamMsg | None:
    """The subject's first message in `stream` at stream sequence `seq` or after (None: there is none)."""
    return await failures.unless_missing(js.get_msg(stream, seq=seq, subject=subject, next=True, direct=True),
                                         lambda e: failures.failed(e, f"reading {what}", **fields))


async def append(js: JetStream, subject: str, data: bytes, headers: dict[str, str], *, what: str,
                 **fields: Any) -> int:
    """Publish `data` with the `headers` that make it conditional (an expected last sequence); its stream
    sequence. `Conflict` when the expectation no longer held: nothing was appended."""
    try:
        ack = await js.publish(subject, data, headers=headers)
    except failures.BUS_ERRORS as e:
        if failures.is_wrong_last(e):
            raise errors.Conflict(f"{what} moved", **fields) from None
        raise failures.unanswered(e, f"appending to {what}", **fields) from None
    return int(ack.seq)


async def purge(js: JetStream, stream: str, subject: str, *, keep_from: int | None = None, what: str,
                **fields: Any) -> None:
    """Remove the subject's messages below stream sequence `keep_from` (None: all of them)."""
    try:
        await js.purge_stream(stream, subject=subject, seq=keep_from)
    except failures.BUS_ERRORS as e:
        raise failures.unanswered(e, f"purging {what}", **fields) from None


async def read_object(store: ObjectStore, name: str, *, what: str, **fields: Any) -> bytes | None:
    """The object's bytes (None: there is no such object)."""
    result = await failures.unless_missing(store.get(name), lambda e: failures.failed(e, f"reading {what}", **fields))
    return None if result is None else result.data or b""
