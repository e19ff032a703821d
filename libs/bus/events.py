"""Core NATS events: publish, and subscribe with decoding (what does not decode is counted and dropped)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from libs import errors
from libs.bus import failures
from libs.bus.types import Client, Message, Subscription
from libs.schemas.base import decode
from libs.telemetry import counter

log = structlog.get_logger("statefleet.bus")

# Shared with request serving (libs/bus/rpc.py): a request without a reply subject is dropped too.
dropped = counter("sf_bus_dropped_total", "Event messages dropped because they did not decode")


async def publish(nc: Client, subject: str, data: bytes) -> None:
    """Core NATS publish; `Unavailable` when the connection cannot take it (closed, draining, full)."""
    with failures.unavailable(f"publish to {subject}"):
        await nc.publish(subject, data)


async def subscribe_events(
    nc: Client, subject: str, typ: Any, handler: Callable[[Any], Awaitable[None]], *, queue: str = ""
) -> Subscription:
    """Deliver decoded events; ones that do not decode are counted, logged and dropped."""

    async def on_msg(m: Message) -> None:
        try:
            event = decode(m.data, typ)
        except errors.SchemaError as e:
            dropped.add(1, {"subject": subject, "reason": e.code})
            log.warning("event_dropped", subject=m.subject, reason=e.detail)
            return
        await handler(event)

    return await nc.subscribe(subject, queue=queue, cb=on_msg)
