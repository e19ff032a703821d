"""Egress: a session's output to its frontend over a WebSocket.

    GET /v1/sessions/{session_id}/output    Authorization: Bearer <input token>
                                            (or the token in the first message, see libs/ws_auth.py)

Each binary frame is one `OutputChunk` (msgpack) exactly as the engine published it
on `sf.output.<session_id>`; the client reassembles by (block, kind, part/parts).
Text frames are JSON: `{"owner": {"server_id", "version", "claimed", "closed"}}` once
on connect and whenever the session's log shows a new owner or claim, so a viewer
sees a move or failover as it happens (blocks it already showed may then come again
from the new owner: a viewer keeps the last block index it showed and skips repeats),
and `{"notice": {"session_id", "kind", "reason", "at"}}` (a `SessionNotice`, kept like
an owner change) when placement suspends the session to relieve an overloaded device
(`overload`, or `capacity_lost` for a C1 no device could keep) and when it resumes it.
Output is a live stream: a viewer that falls `max_buffered` chunks behind loses the
oldest chunks (counted), never an owner change, and never slows the engine or the
other viewers.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import weakref
from typing import Protocol

import msgspec
from aiohttp import WSCloseCode, web

from libs import bus, errors, names
from libs.fence import session_log
from libs.fence.ownership import read_owner
from libs.schemas.base import decode
from libs.schemas.fence import LogRecord
from libs.telemetry import counter
from libs.ws_auth import authenticate_first_message
from libs.ws_limits import SocketGate
from services.fence.notices import notice_text
from services.fence.problems import problem_body
from services.fence.sessions import Sessions

_dropped = counter("sf_fence_output_dropped_total", "Output chunks dropped for a viewer that fell behind")
# The app's open session sockets: closed ("going away") when the ingress shuts down, so a stop is not held
# up by clients that would otherwise keep them open, and those clients learn at once to reconnect.
OPEN_SOCKETS = web.AppKey("open_sockets", weakref.WeakSet)


def track(request: web.Request, ws: web.WebSocketResponse) -> web.WebSocketResponse:
    request.app[OPEN_SOCKETS].add(ws)
    return ws


async def close_sockets(app: web.Application) -> None:
    for ws in list(app[OPEN_SOCKETS]):
        with contextlib.suppress(ConnectionError):
            await ws.close(code=WSCloseCode.GOING_AWAY, message=b"ingress shutting down")


class Outbox:
    """What waits for one viewer: chunks (bounded, oldest dropped first) and owner changes (kept)."""

    def __init__(self, max_chunks: int) -> None:
        self.max_chunks = max_chunks
        self.items: collections.deque[bytes | str] = collections.deque()
        self.chunks = 0
        self.ready = asyncio.Event()

    def chunk(self, data: bytes) -> None:
        if self.chunks >= self.max_chunks:
            oldest = next(i for i, x in enumerate(self.items) if isinstance(x, bytes))
            del self.items[oldest]
            self.chunks -= 1
            _dropped.add(1)
        self.items.append(data)
        self.chunks += 1
        self.ready.set()

    def text(self, data: str) -> None:
        self.items.append(data)
        self.ready.set()

    async def next(self) -> bytes | str:
        while not self.items:
            self.ready.clear()
            await self.ready.wait()
        item = self.items.popleft()
        if isinstance(item, bytes):
            self.chunks -= 1
        return item


class Egress:
    def __init__(self, nc: bus.Client, sessions: Sessions, sockets: SocketGate, *, max_buffered: int = 256) -> None:
        self.nc, self.sessions, self.sockets, self.max_buffered = nc, sessions, sockets, max_buffered

    async def handle(self, request: web.Request, token: str | None) -> web.StreamResponse:
        session_id = session_log.check_session_id(request.match_info["session_id"])
        self.sockets.take()
        try:
            return await self._serve(request, session_id, token)
        finally:
            self.sockets.give()

    async def _serve(self, request: web.Request, session_id: str, token: str | None) -> web.StreamResponse:
        ws = track(request, web.WebSocketResponse(heartbeat=10.0))
        if token is None:  # a browser: the token comes in the first message
            if await authenticate_first_message(request, ws,
                                                lambda t: self.sessions.authenticate(session_id, t),
                                                problem_body) is None:
                return ws
        else:
            await self.sessions.authenticate(session_id, token)
        box = Outbox(self.max_buffered)
        owners = _OwnerChanges(box)

        async def on_chunk(msg) -> None:
            box.chunk(msg.data)

        async def on_log(msg) -> None:
            with contextlib.suppress(errors.SchemaError):
                owners.seen(decode(msg.data, LogRecord).view)

        async def on_notice(msg) -> None:
            if (text := notice_text(msg.data)) is not None:
                box.text(text)

        # Subscribed and flushed before the client is told it is connected (handshake, or the auth
        # answer): from then on it gets every chunk published, every owner change and every notice.
        subs = [await self.nc.subscribe(names.output_subject(session_id), cb=on_chunk),
                await self.nc.subscribe(names.session_log_subject(session_id), cb=on_log),
                await self.nc.subscribe(names.notice_subject(session_id), cb=on_notice)]
        try:
            await self.nc.flush()
            if token is None:
                await ws.send_json({"authenticated": True})
            else:
                await ws.prepare(request)
            with contextlib.suppress(errors.StatefleetError):  # no tail yet: the first log record tells
                owners.seen((await read_owner(self.sessions.js, session_id)).view)
            forward = asyncio.create_task(self._forward(request, ws, box))
            try:
                async for _ in ws:  # the client only listens; reading notices its close
                    pass
            finally:
                forward.cancel()
                with contextlib.suppress(asyncio.CancelledError, ConnectionError):
                    await forward
        finally:
            for sub in subs:
                await bus.quietly(sub.unsubscribe())
        return ws

    async def _forward(self, request: web.Request, ws: web.WebSocketResponse, box: Outbox) -> None:
        while not ws.closed:
            if not await self.sockets.send(request, ws, await box.next()):
                return  # a viewer that stopped reading is dropped, not waited for


class _TextSink(Protocol):
    def text(self, data: str) -> None: ...


class _OwnerChanges:
    """Turns log views into one owner message per change of owner, claim or closing."""

    def __init__(self, box: _TextSink) -> None:
        self.box = box
        self.last: tuple | None = None

    def seen(self, view) -> None:
        if view.owner is None:
            return
        now = (view.owner.server_id, view.owner.version, view.claim == view.owner, view.closed)
        if now == self.last or (self.last is not None and now[1] < self.last[1]):  # repeat, or an older read
            return
        self.last = now
        owner = dict(zip(("server_id", "version", "claimed", "closed"), now, strict=True))
        self.box.text(msgspec.json.encode({"owner": owner}).decode())
