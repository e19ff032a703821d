"""The NATS bus: connection, idempotent provisioning, typed request/reply and events.

Request/reply: a handler returns a Msg or raises a StatefleetError; the error
travels as an `ErrorReply` body marked by the `Sf-Error` header and is raised
again, typed, on the caller's side. Unexpected exceptions are logged with their
traceback here and answered with a bare `internal` error: no traceback ever
reaches a client.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
import urllib.parse
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import nats
import nats.errors
import nats.js.errors
import structlog
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg as NatsMsg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext, api
from nats.js.kv import KeyValue
from nats.js.object_store import ObjectStore

from libs import errors, names
from libs.schemas.base import Msg, decode, encode
from libs.schemas.common import ErrorReply
from libs.telemetry import counter

log = structlog.get_logger("statefleet.bus")

ERROR_HEADER = "Sf-Error"
R = TypeVar("R")
Handler = Callable[[Any], Awaitable[Msg]]

_dropped = counter("sf_bus_dropped_total", "Event messages dropped because they did not decode")
_handler_errors = counter("sf_bus_handler_errors_total", "Requests answered with an error reply")

# Error codes JetStream uses that callers branch on.
JS_WRONG_LAST_SEQUENCE = 10071
JS_STREAM_NAME_IN_USE = 10058
# How often a compare-and-set writer (log append, KV update, input store) re-reads and decides
# again after losing a race before it gives up with `Conflict`: far above what real contention needs.
MAX_CAS_ATTEMPTS = 32
INITIAL_CONNECT_ATTEMPTS = 3
# While disconnected (e.g. the server restarting) publishes queue up to this much, then fail.
RECONNECT_BUFFER_BYTES = 8 * 1024 * 1024
RECONNECT_WAIT_S = 0.25


async def connect(url: str, *, name: str, connect_timeout_s: float = 2.0, user: str = "", password: str = "",
                  tls: ssl.SSLContext | None = None) -> NATS:
    """Connect with reconnect and backoff; a server that never answers is an `Unavailable`.

    `user`/`password` (or credentials in the URL) pick the NATS user; its replies arrive under
    `names.inbox_prefix(user)`, the only inbox its permissions let it read. Once connected, the
    client reconnects forever and nats-py re-subscribes and flushes what was buffered meanwhile.
    """

    async def on_error(e: Exception) -> None:
        log.warning("nats_error", error=str(e) or type(e).__name__)

    client: list[NATS] = []

    async def on_disconnect() -> None:
        if client and client[0].is_closed:
            return  # our own close, not an outage
        log.warning("nats_disconnected", url=redacted(url))

    async def on_reconnect() -> None:
        log.info("nats_reconnected", url=redacted(url))

    user = user or (urllib.parse.urlsplit(url.split(",")[0]).username or "")
    auth: dict[str, Any] = {"user": user, "password": password} if user and password else {}
    try:
        nc = await nats.connect(
            servers=url.split(","),
            name=name,
            connect_timeout=connect_timeout_s,
            reconnect_time_wait=RECONNECT_WAIT_S,
            max_reconnect_attempts=INITIAL_CONNECT_ATTEMPTS,
            allow_reconnect=True,
            error_cb=on_error,
            disconnected_cb=on_disconnect,
            reconnected_cb=on_reconnect,
            inbox_prefix=names.inbox_prefix(user) if user else names.INBOX_ROOT,
            pending_size=RECONNECT_BUFFER_BYTES,
            tls=tls,
            **auth,
        )
    except (TimeoutError, nats.errors.NoServersError, OSError) as e:
        raise errors.Unavailable(f"cannot reach NATS at {redacted(url)}: {e}", url=redacted(url)) from None
    except nats.errors.Error as e:  # e.g. authorization violation: the server said no
        raise errors.Unavailable(f"NATS at {redacted(url)} refused the connection: {e}",
                                 url=redacted(url)) from None
    # Fail fast on the first connect, but once up, ride out any outage.
    nc.options["max_reconnect_attempts"] = -1
    client.append(nc)
    return nc


def tls_context(ca_file: str = "", cert_file: str = "", key_file: str = "") -> ssl.SSLContext | None:
    """A client TLS context when a CA (server verification) or a client certificate is configured."""
    if not (ca_file or cert_file):
        return None
    ctx = ssl.create_default_context(cafile=ca_file or None)
    if cert_file:
        ctx.load_cert_chain(cert_file, key_file or None)
    return ctx


def redacted(url: str) -> str:
    """The URL(s) without passwords, for logs and errors."""
    out = []
    for one in url.split(","):
        parts = urllib.parse.urlsplit(one)
        if parts.password:
            one = one.replace(f":{parts.password}@", ":***@")
        out.append(one)
    return ",".join(out)


# ---------------------------------------------------------------- provisioning


@dataclass(frozen=True, slots=True)
class StreamSpec:
    name: str
    subjects: list[str]
    max_age_s: float | None = None
    max_msgs_per_subject: int = -1
    replicas: int = 1
    # A full stream refuses new messages (the writer gets a retryable error) rather than dropping old
    # ones, which may be what a live session still needs (see docs/configuration.md, retention).
    max_bytes: int = -1


async def ensure_stream(js: JetStreamContext, spec: StreamSpec) -> api.StreamInfo:
    """Create the stream, or bring an existing one to `spec`. Safe to run any number of times."""
    config = api.StreamConfig(
        name=spec.name,
        subjects=spec.subjects,
        storage=api.StorageType.FILE,
        max_age=spec.max_age_s,
        max_msgs_per_subject=spec.max_msgs_per_subject,
        max_bytes=spec.max_bytes,
        discard=api.DiscardPolicy.NEW if spec.max_bytes > 0 else api.DiscardPolicy.OLD,
        num_replicas=spec.replicas,
        allow_direct=True,
    )
    try:
        return await js.add_stream(config)
    except nats.js.errors.BadRequestError as e:
        if e.err_code != JS_STREAM_NAME_IN_USE:
            raise
        return await js.update_stream(config)


async def ensure_kv(
    js: JetStreamContext, bucket: str, *, ttl_s: float | None = None, history: int = 1, replicas: int = 1,
    max_bytes: int = -1,
) -> KeyValue:
    """Create the KV bucket, or open it if it exists (its settings are left as they are). A bucket
    at `max_bytes` refuses new writes."""
    try:
        return await js.create_key_value(bucket=bucket, ttl=ttl_s, history=history, replicas=replicas,
                                         max_bytes=max_bytes)
    except nats.js.errors.BadRequestError as e:
        if e.err_code != JS_STREAM_NAME_IN_USE:
            raise
        log.info("kv_exists_with_other_settings", bucket=bucket)
        return await js.key_value(bucket)


async def kv_entries(kv: KeyValue) -> list[KeyValue.Entry]:
    """The latest entry of every key in the bucket, deleted and purged keys left out, read now.

    Not `KeyValue.keys()`: nats-py lists keys with a watcher whose first pass ends by pending counts, and
    a key rewritten during that pass can be left out, or the listing come back empty (NoKeysError) for a
    bucket that has keys: 20 of 413 listings of a three-key bucket were wrong while one key was rewritten
    in a loop, as heartbeats rewrite theirs (2026-12-01). The server lists a stream's subjects in one step
    (`STREAM.INFO` with a subject filter; up to 100,000 in one reply). The bucket's stream and subject
    prefix are the handle's own (nats-py keeps them as `_stream` and `_pre`)."""
    prefix = kv._pre
    info = await kv._js.stream_info(kv._stream, subjects_filter=f"{prefix}>")
    out = []
    for subject in sorted(info.state.subjects or {}):
        try:
            out.append(await kv.get(subject.removeprefix(prefix)))
        except nats.js.errors.KeyNotFoundError:  # deleted, purged, or expired since the listing
            continue
    return out


async def kv_read(kv: KeyValue, key: str) -> KeyValue.Entry | None:
    """The key's latest entry; None when it has none (never written, deleted, purged). A bus failure is
    `Unavailable`."""
    try:
        return await kv.get(key)
    except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
        return None
    except (nats.errors.Error, TimeoutError, ConnectionError) as e:
        raise _unavailable(e, f"kv {key} not read") from None


async def kv_swap(kv: KeyValue, key: str, value: bytes, revision: int) -> bool:
    """Write `value` only if the key is still at `revision` (0: it has none yet): whether it was written
    (False: another write came first; read again and decide again). A bus failure is `Unavailable`."""
    try:
        if revision:
            await kv.update(key, value, last=revision)
        else:
            await kv.create(key, value)
        return True
    except nats.js.errors.KeyWrongLastSequenceError:
        return False
    except (nats.errors.Error, TimeoutError, ConnectionError) as e:
        raise _unavailable(e, f"kv {key} not written") from None


def _unavailable(e: BaseException, what: str) -> errors.Unavailable:
    return errors.Unavailable(f"{what}: {type(e).__name__}", reason=type(e).__name__)


# What nats-py raises when the bus or the server does not do what was asked (its TimeoutError is a
# TimeoutError too). Only this module and `libs/jetstream.py` name them: everyone else gets ours.
BUS_ERRORS = (nats.errors.Error, nats.js.errors.Error, TimeoutError, ConnectionError)


@contextlib.contextmanager
def unavailable(what: str, **fields: Any) -> Iterator[None]:
    """nats-py's errors raised inside become `Unavailable` (retryable: the bus is away, or a server is
    electing a leader), so the caller handles our typed error only; ours pass through unchanged."""
    try:
        yield
    except errors.StatefleetError:
        raise
    except BUS_ERRORS as e:
        raise errors.Unavailable(f"{what}: {type(e).__name__}", reason=type(e).__name__, **fields) from None


async def quietly(op: Awaitable[Any]) -> None:
    """Await an ending whose failure changes nothing (an unsubscribe, a watcher's stop, an ack the
    server redelivers anyway): a bus error means the thing is gone with its connection already."""
    try:
        await op
    except BUS_ERRORS:
        pass


async def publish(nc: NATS, subject: str, data: bytes) -> None:
    """Core NATS publish; `Unavailable` when the connection cannot take it (closed, draining, full)."""
    with unavailable(f"publish to {subject}"):
        await nc.publish(subject, data)


async def watch(kv: KeyValue) -> KeyValue.KeyWatcher:
    """A watcher of every key (its history first, then None, then updates). A bus failure is `Unavailable`."""
    with unavailable("kv watch not opened"):
        return await kv.watchall()


async def ensure_object_store(js: JetStreamContext, bucket: str, *, replicas: int = 1) -> ObjectStore:
    try:
        return await js.create_object_store(bucket=bucket, replicas=replicas)
    except nats.js.errors.BadRequestError as e:
        if e.err_code != JS_STREAM_NAME_IN_USE:
            raise
        return await js.object_store(bucket)


# ---------------------------------------------------------------- request / reply


def error_reply(err: errors.StatefleetError) -> ErrorReply:
    return ErrorReply(code=err.code, detail=err.detail, retryable=err.retryable, fields=_plain(err.fields))


def raise_error_reply(reply: ErrorReply) -> None:
    cls = errors.by_code(reply.code)
    raise cls(reply.detail, **reply.fields)


async def request(nc: NATS, subject: str, msg: Msg, reply_type: type[R], *, timeout_s: float = 5.0) -> R:
    """Send `msg`, return the decoded reply or raise the remote's typed error."""
    if not nc.is_connected:
        raise errors.Unavailable(f"NATS is not connected; {subject} not sent", subject=subject)
    try:
        resp = await nc.request(subject, encode(msg), timeout=timeout_s)
    except nats.errors.NoRespondersError:
        raise errors.Unavailable(f"nothing serves {subject}", subject=subject) from None
    except (nats.errors.ConnectionClosedError, nats.errors.ConnectionReconnectingError):
        raise errors.Unavailable(f"NATS connection lost during {subject}", subject=subject) from None
    except nats.errors.TimeoutError:
        if not nc.is_connected:  # the connection dropped while we waited: an outage, not a slow peer
            raise errors.Unavailable(f"NATS connection lost during {subject}", subject=subject) from None
        raise errors.Timeout(f"no reply on {subject} within {timeout_s}s", subject=subject) from None
    if resp.headers and resp.headers.get(ERROR_HEADER):
        raise_error_reply(decode(resp.data, ErrorReply))
    return decode(resp.data, reply_type)


async def serve(
    nc: NATS, subject: str, req_type: Any, handler: Handler, *, queue: str = "", concurrency: int = 1
) -> Subscription:
    """Answer requests on `subject`; decoding and handler errors become typed error replies.

    With `concurrency` > 1 up to that many requests are handled at once, each in its own task, so a
    slow one does not hold up the next; past that the subscription waits for a free slot. (Several
    subscriptions in a queue group would not do: the server picks a member at random, busy or not.)
    """
    if concurrency > 1:
        slots = asyncio.Semaphore(concurrency)
        running: set[asyncio.Task[None]] = set()

        def done(task: asyncio.Task[None]) -> None:
            running.discard(task)
            slots.release()

        async def on_msg(m: NatsMsg) -> None:
            await slots.acquire()
            task = asyncio.create_task(answer(m), name=f"serve-{subject}")
            running.add(task)
            task.add_done_callback(done)
    else:
        async def on_msg(m: NatsMsg) -> None:
            await answer(m)

    async def answer(m: NatsMsg) -> None:
        if not m.reply:
            _dropped.add(1, {"subject": subject, "reason": "no_reply_subject"})
            log.warning("request_without_reply_dropped", subject=m.subject)
            return
        try:
            reply = await handler(decode(m.data, req_type))
            await m.respond(encode(reply))
        except errors.StatefleetError as e:
            await respond_error(nc, m.reply, e)
        except Exception:
            error_id = uuid.uuid4().hex[:12]
            log.exception("handler_failed", subject=m.subject, error_id=error_id)
            await respond_error(nc, m.reply, errors.Internal("internal error", error_id=error_id))

    return await nc.subscribe(subject, queue=queue, cb=on_msg)


async def respond_error(nc: NATS, reply_subject: str, e: errors.StatefleetError) -> None:
    _handler_errors.add(1, {"code": e.code})
    await nc.publish(reply_subject, encode(error_reply(e)), headers={ERROR_HEADER: e.code})


async def next_update(watcher: KeyValue.KeyWatcher, timeout_s: float) -> KeyValue.Entry | None:
    """The watcher's next entry (None: the "caught up" marker); `errors.Timeout` when none came within
    `timeout_s`, `Unavailable` when the watch broke. Unlike `watcher.updates(timeout)`, a cancellation
    is never lost (see libs/tasks.py)."""
    try:
        async with asyncio.timeout(timeout_s):
            return await anext(watcher)
    except TimeoutError:
        raise errors.Timeout(f"no kv update within {timeout_s:g}s") from None
    except BUS_ERRORS as e:
        raise _unavailable(e, "kv watch broke") from None


async def subscribe_events(
    nc: NATS, subject: str, typ: Any, handler: Callable[[Any], Awaitable[None]], *, queue: str = ""
) -> Subscription:
    """Deliver decoded events; ones that do not decode are counted, logged and dropped."""

    async def on_msg(m: NatsMsg) -> None:
        try:
            event = decode(m.data, typ)
        except errors.SchemaError as e:
            _dropped.add(1, {"subject": subject, "reason": e.code})
            log.warning("event_dropped", subject=m.subject, reason=e.detail)
            return
        await handler(event)

    return await nc.subscribe(subject, queue=queue, cb=on_msg)


def _plain(fields: dict[str, Any]) -> dict[str, Any]:
    """Error fields as msgpack-safe values."""
    return {k: v if isinstance(v, (str, int, float, bool, type(None))) else str(v) for k, v in fields.items()}


def typed_error(e: BaseException) -> errors.StatefleetError | None:
    """`e` as our typed error: a bus timeout or lost connection (nats-py's own errors, or a bare
    TimeoutError) is the retryable `Unavailable`; anything else that is not ours is None."""
    if isinstance(e, errors.StatefleetError):
        return e
    if isinstance(e, (nats.errors.Error, TimeoutError, ConnectionError)):
        return errors.Unavailable(f"bus: {type(e).__name__}: {e}")
    return None


async def retry_transient(attempt: Callable[[], Awaitable[R]], deadline: float,
                          on_retry: Callable[[errors.StatefleetError], None]) -> R:
    """`await attempt()`, retried with backoff while it fails retryably and the monotonic `deadline`
    allows; the last failure (or any other) surfaces as a typed error."""
    pause = 0.05
    while True:
        try:
            return await attempt()
        except Exception as e:
            error = typed_error(e)
            if error is None:
                raise
            if not error.retryable or time.monotonic() + pause > deadline:
                if error is e:
                    raise
                raise error from e
            on_retry(error)
            await asyncio.sleep(pause)
            pause = min(2 * pause, 2.0)
