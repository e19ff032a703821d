"""Connecting to NATS: servers, user and inbox prefix, TLS, reconnect and its buffer."""

from __future__ import annotations

import ssl
import urllib.parse
from typing import Any

import nats
import structlog

from libs import errors, names
from libs.bus import failures
from libs.bus.types import Client

log = structlog.get_logger("statefleet.bus")

INITIAL_CONNECT_ATTEMPTS = 3
# While disconnected (e.g. the server restarting) publishes queue up to this much, then fail.
RECONNECT_BUFFER_BYTES = 8 * 1024 * 1024
RECONNECT_WAIT_S = 0.25


async def connect(url: str, *, name: str, connect_timeout_s: float = 2.0, user: str = "", password: str = "",
                  tls: ssl.SSLContext | None = None) -> Client:
    """Connect with reconnect and backoff; a server that never answers is an `Unavailable`.

    `user`/`password` (or credentials in the URL) pick the NATS user; its replies arrive under
    `names.inbox_prefix(user)`, the only inbox its permissions let it read. Once connected, the
    client reconnects forever and nats-py re-subscribes and flushes what was buffered meanwhile.
    """

    async def on_error(e: Exception) -> None:
        log.warning("nats_error", error=str(e) or type(e).__name__)

    client: list[Client] = []

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
    except Exception as e:
        if failures.is_unreachable(e):
            raise errors.Unavailable(f"cannot reach NATS at {redacted(url)}: {e}", url=redacted(url)) from None
        if failures.is_refused(e):
            raise errors.Unavailable(f"NATS at {redacted(url)} refused the connection: {e}",
                                     url=redacted(url)) from None
        raise
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
