"""JetStream stream messages: last and next reads, conditional appends, purges, object reads.

With `libs/bus.py` (connections, requests, key-value reads and swaps), this is where nats-py's
exceptions become our typed errors, so no other module catches them:
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

import nats.js.errors
from nats.js import JetStreamContext, api
from nats.js.kv import KeyValue
from nats.js.object_store import ObjectStore

from libs import errors
from libs.bus import BUS_ERRORS, JS_WRONG_LAST_SEQUENCE


def _failed(e: BaseException, what: str, **fields: Any) -> errors.StatefleetError:
    """A read's failure: `Timeout` when unanswered, else `Unavailable`."""
    if isinstance(e, TimeoutError):  # nats-py's TimeoutError is one too
        return errors.Timeout(f"{what}: the bus did not answer in time", **fields)
    return _unanswered(e, what, **fields)


def _unanswered(e: BaseException, what: str, **fields: Any) -> errors.Unavailable:
    """A write's failure: `Unavailable` (it may or may not have landed)."""
    detail = getattr(e, "description", None) or type(e).__name__
    return errors.Unavailable(f"{what}: {detail}", reason=type(e).__name__, **fields)


async def last_msg(js: JetStreamContext, stream: str, subject: str, *, what: str,
                   **fields: Any) -> api.RawStreamMsg | None:
    """The subject's last message in `stream` (None: it has none)."""
    try:
        return await js.get_last_msg(stream, subject, direct=True)
    except nats.js.errors.NotFoundError:
        return None
    except BUS_ERRORS as e:
        raise _failed(e, f"reading {what}", **fields) from None


async def next_msg(js: JetStreamContext, stream: str, subject: str, seq: int, *, what: str,
                   **fields: Any) -> api.RawStreamMsg | None:
    """The subject's first message in `stream` at stream sequence `seq` or after (None: there is none)."""
    try:
        return await js.get_msg(stream, seq=seq, subject=subject, next=True, direct=True)
    except nats.js.errors.NotFoundError:
        return None
    except BUS_ERRORS as e:
        raise _failed(e, f"reading {what}", **fields) from None


async def append(js: JetStreamContext, subject: str, data: bytes, headers: dict[str, str], *, what: str,
                 **fields: Any) -> int:
    """Publish `data` with the `headers` that make it conditional (an expected last sequence); its stream
    sequence. `Conflict` when the expectation no longer held: nothing was appended."""
    try:
        ack = await js.publish(subject, data, headers=headers)
    except nats.js.errors.APIError as e:
        if e.err_code == JS_WRONG_LAST_SEQUENCE:
            raise errors.Conflict(f"{what} moved", **fields) from None
        raise _unanswered(e, f"appending to {what}", **fields) from None
    except BUS_ERRORS as e:
        raise _unanswered(e, f"appending to {what}", **fields) from None
    return int(ack.seq)


async def purge(js: JetStreamContext, stream: str, subject: str, *, keep_from: int | None = None, what: str,
                **fields: Any) -> None:
    """Remove the subject's messages below stream sequence `keep_from` (None: all of them)."""
    try:
        await js.purge_stream(stream, subject=subject, seq=keep_from)
    except BUS_ERRORS as e:
        raise _unanswered(e, f"purging {what}", **fields) from None


async def bucket(js: JetStreamContext, name: str) -> KeyValue | None:
    """The key-value bucket (None: it was never created)."""
    try:
        return await js.key_value(name)
    except nats.js.errors.BucketNotFoundError:
        return None
    except BUS_ERRORS as e:
        raise _failed(e, f"opening bucket {name}") from None


async def purge_key(kv: KeyValue, key: str, *, what: str, **fields: Any) -> None:
    """Remove the key and its history from the bucket."""
    try:
        await kv.purge(key)
    except BUS_ERRORS as e:
        raise _unanswered(e, f"purging {what}", **fields) from None


async def read_object(store: ObjectStore, name: str, *, what: str, **fields: Any) -> bytes | None:
    """The object's bytes (None: there is no such object)."""
    try:
        return (await store.get(name)).data or b""
    except nats.js.errors.ObjectNotFoundError:
        return None
    except BUS_ERRORS as e:
        raise _failed(e, f"reading {what}", **fields) from None
