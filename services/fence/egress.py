"""Egress: a session's output to its frontend over a WebSocket.

    GET /v1/sessions/{session_id}/output    Authorization: Bearer <input token>

Each binary frame is one `OutputChunk` (msgpack) exactly as the engine published it
on `sf.output.<session_id>`; the client reassembles by (block, kind, part/parts).
Output is a live stream: a viewer that falls `max_buffered` chunks behind loses the
oldest ones (counted), never slowing the engine or the other viewers.
"""

from __future__ import annotations

import asyncio
import contextlib

import nats.errors
from aiohttp import web
from nats.aio.client import Client as NATS

from libs import names
from libs.fence import session_log
from libs.telemetry import counter
from services.fence.sessions import Sessions

_dropped = counter("sf_fence_output_dropped_total", "Output chunks dropped for a viewer that fell behind")


class Egress:
    def __init__(self, nc: NATS, sessions: Sessions, *, max_buffered: int = 256) -> None:
        self.nc, self.sessions, self.max_buffered = nc, sessions, max_buffered

    async def handle(self, request: web.Request, token: str | None) -> web.StreamResponse:
        session_id = session_log.check_session_id(request.match_info["session_id"])
        await self.sessions.authenticate(session_id, token)
        queue: asyncio.Queue[bytes] = asyncio.Queue(self.max_buffered)

        async def on_chunk(msg) -> None:
            if queue.full():
                queue.get_nowait()
                _dropped.add(1)
            queue.put_nowait(msg.data)

        # Subscribed and flushed before the handshake completes: a client that is told it is
        # connected gets every chunk published from then on.
        sub = await self.nc.subscribe(names.output_subject(session_id), cb=on_chunk)
        ws = web.WebSocketResponse(heartbeat=10.0)
        try:
            await self.nc.flush()
            await ws.prepare(request)
        except BaseException:
            with contextlib.suppress(nats.errors.Error):
                await sub.unsubscribe()
            raise
        forward = asyncio.create_task(self._forward(ws, queue))
        try:
            async for _ in ws:  # the client only listens; reading notices its close
                pass
        finally:
            forward.cancel()
            with contextlib.suppress(asyncio.CancelledError, ConnectionError):
                await forward
            with contextlib.suppress(nats.errors.Error):
                await sub.unsubscribe()
        return ws

    @staticmethod
    async def _forward(ws: web.WebSocketResponse, queue: asyncio.Queue[bytes]) -> None:
        while not ws.closed:
            await ws.send_bytes(await queue.get())

