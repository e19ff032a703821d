"""Who may open a WebSocket: an allowed Origin, and a bearer token (a session's input token at
fence's ingress, the admin token on admission's fleet feed).

A browser's WebSocket cannot send an `Authorization` header, so a socket opened
without one authenticates in its first message instead:

    → {"type": "auth", "token": "<token>"}
    ← {"authenticated": true}             (then the socket's normal traffic)
    ← {"error": <problem>} and close 4401 (wrong or missing token, or none within AUTH_TIMEOUT_S)

Clients that can send the header (the CLI, other services) keep doing so and
are authenticated before the handshake. A request that carries an `Origin`
(every browser sends one) must come from the server's own origin or an allowed
one; clients that send no Origin are not browsers and are not subject to it.
The token is never logged and never read from the URL.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit

import msgspec
from aiohttp import WSMsgType, web

from libs import errors
from libs.telemetry import counter

AUTH_TIMEOUT_S = 5.0
CLOSE_UNAUTHORIZED = 4401  # application close code: authentication failed
MAX_AUTH_BYTES = 1024
REFUSED = counter("sf_ws_refused_total",
                  "WebSockets refused or closed by a limit, by reason (origin, token, sockets, idle, slow_reader)")
ProblemBody = Callable[[errors.StatefleetError], dict]


class AuthMessage(msgspec.Struct, forbid_unknown_fields=True):
    type: str
    token: str


_auth_decoder = msgspec.json.Decoder(AuthMessage)


class Origins:
    """The browser origins allowed to open sockets, besides the server's own."""

    def __init__(self, allowed: list[str]) -> None:
        self.allowed = frozenset(_normal(o) for o in allowed if o)

    def check(self, request: web.Request) -> None:
        origin = request.headers.get("Origin")
        if origin is None:
            return
        own = _normal(f"{request.scheme}://{request.host}")
        if _normal(origin) not in self.allowed | {own}:
            REFUSED.add(1, {"reason": "origin"})
            raise errors.Forbidden("this origin may not open sockets here", field="Origin")


def _normal(origin: str) -> str:
    parts = urlsplit(origin.strip().lower())
    return f"{parts.scheme}://{parts.netloc}"


async def authenticate_first_message(request: web.Request, ws: web.WebSocketResponse,
                                     authenticate: Callable[[str | None], Awaitable[object]],
                                     problem_body: ProblemBody) -> str | None:
    """Complete the handshake of a socket opened without a header token, then read and check the token
    in its first message; returns it (the caller answers {"authenticated": true} once it is ready),
    or None (the socket answered and closed) when it did not check."""
    await ws.prepare(request)
    try:
        token = await asyncio.wait_for(_first_token(ws), AUTH_TIMEOUT_S)
        await authenticate(token)
    except TimeoutError:
        return await _refuse(ws, problem_body(errors.Unauthorized("no auth message in time", field="token")))
    except errors.StatefleetError as e:
        return await _refuse(ws, problem_body(e))
    return token


async def _first_token(ws: web.WebSocketResponse) -> str | None:
    msg = await ws.receive()
    if msg.type != WSMsgType.TEXT or len(msg.data) > MAX_AUTH_BYTES:
        raise errors.Unauthorized("the first message must be {\"type\": \"auth\", \"token\": ...}", field="token")
    try:
        auth = _auth_decoder.decode(msg.data)
    except msgspec.DecodeError:
        raise errors.Unauthorized("the first message must be {\"type\": \"auth\", \"token\": ...}",
                                  field="token") from None
    if auth.type != "auth":
        raise errors.Unauthorized("the first message must be an auth message", field="token")
    return auth.token


async def _refuse(ws: web.WebSocketResponse, problem: dict) -> None:
    REFUSED.add(1, {"reason": "token"})
    with contextlib.suppress(ConnectionError):
        await ws.send_json({"error": problem})
        await ws.close(code=CLOSE_UNAUTHORIZED, message=b"unauthorized")
    return None
