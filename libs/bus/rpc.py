"""Typed request/reply over core NATS.

A handler returns a Msg or raises a StatefleetError; the error travels as an `ErrorReply` body marked by
the `Sf-Error` header and is raised again, typed, on the caller's side. Unexpected exceptions are logged
with their traceback here and answered with a bare `internal` error: no traceback ever reaches a client.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import structlog

from libs import errors
from libs.bus import failures
from libs.bus.events import dropped
from libs.bus.types import Client, Message, Subscription
from libs.schemas.base import Msg, decode, encode
from libs.schemas.common import ErrorReply
from libs.telemetry import counter

log = structlog.get_logger("statefleet.bus")

ERROR_HEADER = "Sf-Error"
R = TypeVar("R")
Handler = Callable[[Any], Awaitable[Msg]]

_handler_errors = counter("sf_bus_handler_errors_total", "Requests answered with an error reply")


def error_reply(err: errors.StatefleetError) -> ErrorReply:
    return ErrorReply(code=err.code, detail=err.detail, retryable=err.retryable, fields=_plain(err.fields))


def raise_error_reply(reply: ErrorReply) -> None:
    cls = errors.by_code(reply.code)
    raise cls(reply.detail, **reply.fields)


async def request(nc: Client, subject: str, msg: Msg, reply_type: type[R], *, timeout_s: float = 5.0) -> R:
    """Send `msg`, return the decoded reply or raise the remote's typed error: nothing serving the
    subject, or the connection lost meanwhile, is `Unavailable`; no reply in time is `Timeout`."""
    if not nc.is_connected:
        raise errors.Unavailable(f"NATS is not connected; {subject} not sent", subject=subject)
    try:
        resp = await nc.request(subject, encode(msg), timeout=timeout_s)
    except failures.BUS_ERRORS as e:
        if failures.is_no_responders(e):
            raise errors.Unavailable(f"nothing serves {subject}", subject=subject) from None
        # A timeout while the connection dropped is an outage, not a slow peer.
        if failures.is_connection_lost(e) or (isinstance(e, TimeoutError) and not nc.is_connected):
            raise errors.Unavailable(f"NATS connection lost during {subject}", subject=subject) from None
        if isinstance(e, TimeoutError):
            raise errors.Timeout(f"no reply on {subject} within {timeout_s}s", subject=subject) from None
        raise failures.unanswered(e, f"request on {subject}", subject=subject) from None
    if resp.headers and resp.headers.get(ERROR_HEADER):
        raise_error_reply(decode(resp.data, ErrorReply))
    return decode(resp.data, reply_type)


async def serve(
    nc: Client, subject: str, req_type: Any, handler: Handler, *, queue: str = "", concurrency: int = 1
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

        async def on_msg(m: Message) -> None:
            await slots.acquire()
            task = asyncio.create_task(answer(m), name=f"serve-{subject}")
            running.add(task)
            task.add_done_callback(done)
    else:
        async def on_msg(m: Message) -> None:
            await answer(m)

    async def answer(m: Message) -> None:
        if not m.reply:
            dropped.add(1, {"subject": subject, "reason": "no_reply_subject"})
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


async def respond_error(nc: Client, reply_subject: str, e: errors.StatefleetError) -> None:
    _handler_errors.add(1, {"code": e.code})
    await nc.publish(reply_subject, encode(error_reply(e)), headers={ERROR_HEADER: e.code})


def _plain(fields: dict[str, Any]) -> dict[str, Any]:
    """Error fields as msgpack-safe values."""
    return {k: v if isinstance(v, (str, int, float, bool, type(None))) else str(v) for k, v in fields.items()}
