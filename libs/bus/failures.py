"""The one place that names nats-py's exceptions: predicates over them, and their translation into ours.

The other modules of this package catch `BUS_ERRORS` and ask these predicates which case they hold;
modules outside the package never see a nats-py exception (see the package docstring).
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import nats.errors
import nats.js.errors

from libs import errors

T = TypeVar("T")

# Error codes JetStream uses that we branch on.
JS_WRONG_LAST_SEQUENCE = 10071
JS_STREAM_NAME_IN_USE = 10058

# What nats-py raises when the bus or the server does not do what was asked (its TimeoutError is a
# TimeoutError too; nats.js.errors.Error is a nats.errors.Error).
BUS_ERRORS = (nats.errors.Error, nats.js.errors.Error, TimeoutError, ConnectionError)


def is_missing(e: BaseException) -> bool:
    """Nothing there: no such key (never written, deleted, purged), message, bucket or object."""
    return isinstance(e, nats.js.errors.NotFoundError)


async def unless_missing(op: Awaitable[T], failure: Callable[[BaseException], errors.StatefleetError]) -> T | None:
    """`await op`: None when there is nothing there (`is_missing`), any other bus failure `failure(e)`."""
    try:
        return await op
    except BUS_ERRORS as e:
        if is_missing(e):
            return None
        raise failure(e) from None


def is_wrong_last(e: BaseException) -> bool:
    """A conditional write whose expected last sequence (or KV revision) no longer held: nothing written."""
    return isinstance(e, nats.js.errors.KeyWrongLastSequenceError) or (
        isinstance(e, nats.js.errors.APIError) and e.err_code == JS_WRONG_LAST_SEQUENCE)


def is_name_in_use(e: BaseException) -> bool:
    """Creating a stream (or bucket) that exists with other settings."""
    return isinstance(e, nats.js.errors.BadRequestError) and e.err_code == JS_STREAM_NAME_IN_USE


def is_no_responders(e: BaseException) -> bool:
    return isinstance(e, nats.errors.NoRespondersError)


def is_connection_lost(e: BaseException) -> bool:
    return isinstance(e, (nats.errors.ConnectionClosedError, nats.errors.ConnectionReconnectingError))


def is_unreachable(e: BaseException) -> bool:
    """A first connect that found no server answering."""
    return isinstance(e, (TimeoutError, nats.errors.NoServersError, OSError))


def is_refused(e: BaseException) -> bool:
    """A first connect the server answered with a no (e.g. an authorization violation)."""
    return isinstance(e, nats.errors.Error)


def unanswered(e: BaseException, what: str, **fields: Any) -> errors.Unavailable:
    """A write's (or any call's) failure: `Unavailable`, retryable; a write that said so may or may not
    have landed. The server's own description, when it gave one, goes into the detail."""
    detail = getattr(e, "description", None) or type(e).__name__
    return errors.Unavailable(f"{what}: {detail}", reason=type(e).__name__, **fields)


def failed(e: BaseException, what: str, **fields: Any) -> errors.StatefleetError:
    """A read's failure: `Timeout` when unanswered, else `Unavailable`."""
    if isinstance(e, TimeoutError):  # nats-py's TimeoutError is one too
        return errors.Timeout(f"{what}: the bus did not answer in time", **fields)
    return unanswered(e, what, **fields)


def lost(e: BaseException, what: str) -> errors.Unavailable:
    return errors.Unavailable(f"{what}: {type(e).__name__}", reason=type(e).__name__)


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


def typed_error(e: BaseException) -> errors.StatefleetError | None:
    """`e` as our typed error: a bus timeout or lost connection (nats-py's own errors, or a bare
    TimeoutError) is the retryable `Unavailable`; anything else that is not ours is None."""
    if isinstance(e, errors.StatefleetError):
        return e
    if isinstance(e, (nats.errors.Error, TimeoutError, ConnectionError)):
        return errors.Unavailable(f"bus: {type(e).__name__}: {e}")
    return None
