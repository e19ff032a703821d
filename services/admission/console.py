"""The browser console admission serves: the session page, the fleet dashboard, their live feed and actions.

  GET  /session, /dashboard          the pages (plain HTML/CSS/JS from web/, no build step, works offline)
  GET  /static/{file}                their scripts and styles
  GET  /v1/admin/feed                WebSocket: the admin token in the first message (libs/ws_auth.py),
                                     then one JSON fleet snapshot whenever it changed (at most 4 a second)
  POST /v1/admin/sessions/{id}/move  {"to": host_id, "deadline_s"?} → the mover's receipt (admin token header)

Pages are sent with a Content-Security-Policy that allows only their own scripts
and the ingress (its sockets, and its WebRTC offer endpoint), so text that reaches a page cannot run as code even if
some future change wrote it as HTML (the pages only ever set textContent).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
from collections.abc import Awaitable, Callable
from pathlib import Path
from urllib.parse import urlsplit

import msgspec
from aiohttp import web

from libs import errors
from libs.schemas.admission import MoveBody
from libs.schemas.motion import MoveReceipt
from libs.ws_auth import Origins, authenticate_first_message
from libs.ws_limits import SocketGate
from services.admission.auth import Credentials
from services.admission.fleet_feed import FleetFeed
from services.admission.http import _json, _session_id

WEB = Path(__file__).parent / "web"
STATIC = {"session.js": "text/javascript", "dashboard.js": "text/javascript", "common.js": "text/javascript",
          "rtc.js": "text/javascript", "session_rtc.js": "text/javascript", "style.css": "text/css"}
FEED_MIN_GAP_S = 0.25
FEED_IDLE_S = 2.0  # a snapshot at least this often, so ages and dead hosts update


Mover = Callable[[str, str, float], Awaitable[MoveReceipt]]


def add_console(app: web.Application, *, feed: FleetFeed, admin_token: str, move: Mover, ingress_url: str,
                sockets: SocketGate) -> None:
    policy = _csp(ingress_url)
    origins = Origins([])  # the feed is for admission's own pages only

    def page(name: str):
        async def handler(_: web.Request) -> web.Response:
            return web.Response(body=(WEB / name).read_bytes(), content_type="text/html", headers=_headers(policy))
        return handler

    async def static(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in STATIC:
            raise errors.NotFound("no such file", field="name")
        return web.Response(body=(WEB / name).read_bytes(), content_type=STATIC[name], headers=_headers(policy))

    async def index(_: web.Request) -> web.Response:
        raise web.HTTPFound("/session")

    async def feed_socket(request: web.Request) -> web.StreamResponse:
        origins.check(request)
        sockets.take()  # refused: 503 problem+json by the app's middleware, before the upgrade
        try:
            return await serve_feed(request)
        finally:
            sockets.give()

    async def serve_feed(request: web.Request) -> web.StreamResponse:
        ws = web.WebSocketResponse(heartbeat=10.0)
        if await authenticate_first_message(request, ws, lambda t: _admin(t, admin_token), _problem) is None:
            return ws
        await ws.send_json({"authenticated": True})
        sender = asyncio.create_task(_send_snapshots(request, ws, feed, sockets))
        try:
            async for _ in ws:  # the page only listens; reading notices its close
                pass
        finally:
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError, ConnectionError):
                await sender
        return ws

    async def move_session(request: web.Request) -> web.Response:
        Credentials(admin_token, {}).admin(request)
        sid = _session_id(request)
        try:
            body = msgspec.json.decode(await request.read(), type=MoveBody)
        except msgspec.DecodeError as e:
            raise errors.BadRequest(f"invalid move body: {e}", field="body") from None
        return _json(await move(sid, body.to, body.deadline_s))

    app.router.add_get("/", index, allow_head=False)
    app.router.add_get("/session", page("session.html"), allow_head=False)
    app.router.add_get("/dashboard", page("dashboard.html"), allow_head=False)
    app.router.add_get("/static/{name}", static, allow_head=False)
    app.router.add_get("/v1/admin/feed", feed_socket, allow_head=False)
    app.router.add_post("/v1/admin/sessions/{session_id}/move", move_session)


async def _send_snapshots(request: web.Request, ws: web.WebSocketResponse, feed: FleetFeed,
                          sockets: SocketGate) -> None:
    sent, last = -1, 0.0
    loop = asyncio.get_running_loop()
    while not ws.closed:
        if feed.version != sent or loop.time() - last >= FEED_IDLE_S:
            sent, last = feed.version, loop.time()
            if not await sockets.send(request, ws, msgspec.json.encode({"snapshot": feed.snapshot()}).decode()):
                return
        await asyncio.sleep(FEED_MIN_GAP_S)


async def _admin(token: str | None, admin_token: str) -> None:
    if not admin_token:
        raise errors.Forbidden("the admin API is disabled: no admin_token is configured")
    if not token or not hmac.compare_digest(token.encode(), admin_token.encode()):
        raise errors.Unauthorized("the fleet feed needs the admin token", field="token")


def _problem(e: errors.StatefleetError) -> dict:
    return {"title": e.code, "status": e.http_status, "detail": e.detail, "code": e.code}


def _csp(ingress_url: str) -> str:
    ingress = urlsplit(ingress_url)
    ws = f"{'wss' if ingress.scheme == 'https' else 'ws'}://{ingress.netloc}"
    return ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' blob: data:; "
            f"connect-src 'self' {ws} {ingress.scheme}://{ingress.netloc}; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")


def _headers(policy: str) -> dict[str, str]:
    return {"Content-Security-Policy": policy, "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "no-referrer", "Cache-Control": "no-store"}
