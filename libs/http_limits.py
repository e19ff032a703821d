"""Connection, slow-client and idle limits for an aiohttp server (fence's ingress, admission's API).

aiohttp bounds none of these itself: it reads a request head for as long as the client
trickles it (slowloris), keeps an idle keep-alive connection for an hour, and accepts any
number of connections. `serve` starts an app behind a `ConnectionGuard`, which wraps every
connection's protocol and enforces, per server:

- at most `max_connections` open connections: one more is answered 503 problem+json
  (`Retry-After`) and closed without reading it;
- a request head must arrive within `head_timeout_s` of its first byte, and a body within
  `body_timeout_s` of its head: else 408 problem+json and the connection closes;
- a connection with no request in flight is closed after `idle_timeout_s` of silence.

A connection serving a request (a WebSocket included, for its whole life) is never closed by
these timers; WebSockets have their own limits (libs/ws_limits.py). Every refusal is counted in
`sf_http_refused_total{server, reason}`.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field

from aiohttp import web

from libs.telemetry import counter

_refused = counter("sf_http_refused_total",
                   "HTTP connections and requests refused by the server's limits, by reason "
                   "(connections, head_timeout, body_timeout, idle)")
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


@dataclass(frozen=True, slots=True, kw_only=True)
class HttpLimits:
    max_connections: int = 1024
    head_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    idle_timeout_s: float = 60.0


def canned(status: int, code: str, detail: str, *, retry_after_s: int | None = None) -> bytes:
    """A complete HTTP/1.1 problem+json response that closes the connection (written before aiohttp parses)."""
    body = json.dumps({"type": f"urn:statefleet:error:{code}", "title": code, "status": status,
                       "detail": detail, "code": code, "retryable": True}).encode()
    reason = {408: "Request Timeout", 503: "Service Unavailable"}[status]
    head = [f"HTTP/1.1 {status} {reason}", "Content-Type: application/problem+json",
            f"Content-Length: {len(body)}", "Connection: close"]
    if retry_after_s is not None:
        head.append(f"Retry-After: {retry_after_s}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def problem(status: int, code: str, detail: str, *, retryable: bool = True, **headers: str) -> web.Response:
    body = {"type": f"urn:statefleet:error:{code}", "title": code, "status": status, "detail": detail,
            "code": code, "retryable": retryable}
    return web.json_response(body, status=status, content_type="application/problem+json", headers=headers)


class ConnectionGuard:
    """The open connections of one server, their timers, and the middleware that tells them a request runs."""

    def __init__(self, limits: HttpLimits, server: str) -> None:
        self.limits, self.server = limits, server
        self.conns: dict[asyncio.BaseTransport, _Conn] = {}
        self.open = 0

    def wrap(self, factory):
        def make() -> asyncio.Protocol:
            if self.open >= self.limits.max_connections:
                return _Refuse(self)
            self.open += 1
            return _Conn(self, factory())
        return make

    def refused(self, reason: str) -> None:
        _refused.add(1, {"server": self.server, "reason": reason})

    @web.middleware
    async def middleware(self, request: web.Request, handler) -> web.StreamResponse:
        conn = self.conns.get(request.transport) if request.transport is not None else None
        if conn is not None:
            conn.request_started()
        try:
            if request.method in _BODY_METHODS and request.body_exists:
                try:  # read here, under the deadline; the handler's read returns the same bytes
                    await asyncio.wait_for(request.read(), self.limits.body_timeout_s)
                except TimeoutError:
                    self.refused("body_timeout")
                    return problem(408, "request_timeout",
                                   f"the request body did not arrive within {self.limits.body_timeout_s}s",
                                   Connection="close")
                except web.HTTPRequestEntityTooLarge as e:
                    return problem(413, "too_large", e.text or "request body too large", retryable=False)
            return await handler(request)
        finally:
            if conn is not None:
                conn.request_ended()


@dataclass(eq=False)
class _Conn(asyncio.Protocol):
    """One connection: aiohttp's own protocol inside, the head and idle timers around it."""

    guard: ConnectionGuard
    inner: asyncio.Protocol
    transport: asyncio.Transport | None = None
    active: int = 0
    timer: asyncio.TimerHandle | None = None
    waiting_head: bool = False
    _loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.get_running_loop)

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.guard.conns[transport] = self
        self._arm(self.guard.limits.idle_timeout_s, "idle")
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self.active == 0 and not self.waiting_head:  # the first byte of a request: its head is due
            self.waiting_head = True
            self._arm(self.guard.limits.head_timeout_s, "head_timeout")
        self.inner.data_received(data)

    def eof_received(self):
        return self.inner.eof_received()

    def connection_lost(self, exc) -> None:
        self._cancel()
        if self.transport is not None:
            self.guard.conns.pop(self.transport, None)
        self.guard.open -= 1
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    def request_started(self) -> None:
        self.active += 1
        self.waiting_head = False
        self._cancel()

    def request_ended(self) -> None:
        self.active -= 1
        if self.active == 0 and self.transport is not None and not self.transport.is_closing():
            self._arm(self.guard.limits.idle_timeout_s, "idle")

    def _arm(self, after_s: float, reason: str) -> None:
        self._cancel()
        self.timer = self._loop.call_later(after_s, self._expire, reason)

    def _cancel(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _expire(self, reason: str) -> None:
        self.timer = None
        if self.active or self.transport is None or self.transport.is_closing():
            return
        self.guard.refused(reason)
        if reason == "head_timeout":
            self.transport.write(canned(408, "request_timeout", f"the request head did not arrive within "
                                                                f"{self.guard.limits.head_timeout_s}s"))
        self.transport.close()


class _Refuse(asyncio.Protocol):
    """A connection over the limit: answered 503 at once, never read, closed once the client hangs up."""

    def __init__(self, guard: ConnectionGuard) -> None:
        self.guard = guard
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.guard.refused("connections")
        transport.write(canned(503, "too_many_connections",
                               f"{self.guard.limits.max_connections} connections are open here; retry",
                               retry_after_s=1))
        if transport.can_write_eof():
            transport.write_eof()  # the client reads the answer, then hangs up; closing now could reset it
        asyncio.get_running_loop().call_later(2.0, transport.close)

    def data_received(self, data: bytes) -> None:
        pass  # never parsed

    def eof_received(self) -> bool:
        assert self.transport is not None
        self.transport.close()
        return False


class GuardedSite(web.TCPSite):
    """A TCP site whose connections pass through a `ConnectionGuard`."""

    def __init__(self, runner: web.BaseRunner, host: str, port: int, guard: ConnectionGuard) -> None:
        super().__init__(runner, host, port)
        self._guard = guard

    async def start(self) -> None:
        await web.BaseSite.start(self)
        server = self._runner.server
        assert server is not None
        self._server = await asyncio.get_running_loop().create_server(
            self._guard.wrap(server), self._host, self._port, backlog=self._backlog)


async def serve(app: web.Application, host: str, port: int, limits: HttpLimits,
                server: str) -> tuple[web.AppRunner, int, ConnectionGuard]:
    """Start `app` on host:port (0: a free port) behind the limits; returns the runner, the port and the guard."""
    guard = ConnectionGuard(limits, server)
    app.middlewares.insert(0, guard.middleware)
    # aiohttp's own keep-alive close backs the guard's idle timer up (its default is an hour); a second
    # later, so the guard's (counted) close comes first.
    runner = web.AppRunner(app, access_log=None, keepalive_timeout=limits.idle_timeout_s + 1.0)
    await runner.setup()
    site = GuardedSite(runner, host, port, guard)
    await site.start()
    return runner, runner.addresses[0][1], guard
