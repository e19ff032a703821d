"""WebSocket limits for a server's sockets (fence's input and output sockets, admission's fleet feed).

- At most `max_sockets` open at once: one more is refused before the upgrade, 503
  problem+json with `Retry-After` (`SocketGate.admit`).
- An input socket silent for `idle_timeout_s` is closed with code 4408 ("idle").
- A send the client does not take within `send_timeout_s` (it stopped reading, and the
  socket's buffers are full) drops the connection: a close frame could not pass the full
  buffer either, so the client sees the connection reset (and the server counts it).

Each refusal is counted in `sf_ws_refused_total{reason}` (sockets, idle, slow_reader) next
to the authentication refusals of libs/ws_auth.py.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from aiohttp import WSMessage, WSMsgType, web

from libs import errors
from libs.ws_auth import REFUSED

CLOSE_IDLE = 4408
_ENDED = (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED, WSMsgType.ERROR)
_CLOSE_GRACE_S = 1.0


@dataclass(frozen=True, slots=True, kw_only=True)
class SocketLimits:
    max_sockets: int = 512
    idle_timeout_s: float = 300.0
    send_timeout_s: float = 10.0


class SocketGate:
    """One server's open WebSockets and the timeouts on their traffic."""

    def __init__(self, limits: SocketLimits) -> None:
        self.limits = limits
        self.open = 0

    def take(self) -> None:
        """Take a socket slot (before the upgrade); `Unavailable` (503, retryable) when none is free."""
        if self.open >= self.limits.max_sockets:
            REFUSED.add(1, {"reason": "sockets"})
            raise errors.Unavailable(f"{self.limits.max_sockets} WebSockets are open here; retry",
                                     max_sockets=self.limits.max_sockets, retry_after_s=1)
        self.open += 1

    def give(self) -> None:
        self.open -= 1

    async def receive(self, request: web.Request, ws: web.WebSocketResponse) -> WSMessage | None:
        """The client's next message; None once the socket ended or was closed for idling."""
        try:
            msg = await ws.receive(timeout=self.limits.idle_timeout_s)
        except TimeoutError:
            REFUSED.add(1, {"reason": "idle"})
            await _close(request, ws, CLOSE_IDLE, f"idle: no message in {self.limits.idle_timeout_s:g}s")
            return None
        return None if msg.type in _ENDED else msg

    async def send(self, request: web.Request, ws: web.WebSocketResponse, data: str | bytes) -> bool:
        """Send one message; False (and the socket closed) when the client did not take it in time."""
        transport = request.transport  # taken first: aiohttp forgets it once it gives up on a close
        send = ws.send_str(data) if isinstance(data, str) else ws.send_bytes(data)
        try:
            size = 4 * len(data) if isinstance(data, str) else len(data)  # UTF-8: at most 4 bytes a character
            if transport is not None and _fits(transport, size):
                await send  # lands in the transport's buffer below its high-water mark: cannot wait
            else:
                # a timeout scope, not wait_for: on Python 3.11 wait_for runs the send as a task of its
                # own, two loop turns later, which spread a socket's answers out, and with them its
                # client's next frames (docs/bench-gateway.md)
                async with asyncio.timeout(self.limits.send_timeout_s):
                    await send
        except TimeoutError:
            REFUSED.add(1, {"reason": "slow_reader"})
            # A close frame cannot pass a buffer the client does not drain, and a graceful close
            # would wait on that buffer: the connection is dropped.
            if transport is not None:
                transport.abort()
            return False
        except ConnectionError:
            return False
        return True


def _fits(transport: asyncio.WriteTransport, size: int) -> bool:
    """A write of `size` bytes (plus a frame header) leaves the buffer below the high-water mark, so the
    transport does not pause writing and the send returns without waiting for the client: no timer."""
    return transport.get_write_buffer_size() + size + 16 < transport.get_write_buffer_limits()[1]


async def _close(request: web.Request, ws: web.WebSocketResponse, code: int, reason: str) -> None:
    transport = request.transport  # taken first: aiohttp forgets it when its close gives up
    try:
        await asyncio.wait_for(ws.close(code=code, message=reason.encode()[:120]), _CLOSE_GRACE_S)
    except (TimeoutError, ConnectionError):
        # The close frame could not get out, and a plain close would wait for a full buffer to drain
        # (forever, for a client that does not read): drop the connection.
        if transport is not None:
            transport.abort()
