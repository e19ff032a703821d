"""Ingress: HTTP POST and WebSocket endpoints through which a frontend sends a session's control items.

    POST /v1/sessions/{session_id}/items        Authorization: Bearer <input token>
         {"kind": "text" | "action" | "audio" | "json" | "clear" | "segment_end", "data": <JSON>}  →  200 {"session_id", "seq"}
         (audio: base64 16 kHz s16le PCM, or an AudioChunk object; clear/segment_end: libs/schemas/voice.py)
    GET  /v1/sessions/{session_id}/ws           (WebSocket, same header, or the token in the first
         message: see libs/ws_auth.py) one item per text frame, each answered {"seq": n} or
         {"error": <problem>} in order; a bad frame does not close it.
         Up to WS_WINDOW frames are in flight at once (read, validated and queued for storing in
         frame order), so one socket's items share stores; beyond that the socket is not read.
    GET  /v1/sessions/{session_id}/output       (WebSocket, authenticated the same way) the session's
         output chunks and owner changes (see egress.py).

Both sockets refuse a browser Origin other than the ingress's own or a configured one.

An item is acknowledged only after it is stored in the input stream with its seq.
Errors are `application/problem+json` with the typed error's code; no traceback
and never the token reaches a client or a log.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
import weakref
from typing import Annotated, Literal

import msgspec
import structlog
from aiohttp import WSMsgType, web

from libs import errors, voice_items
from libs.fence import session_log
from libs.schemas.fence import SessionMeta
from libs.ws_auth import Origins, authenticate_first_message
from libs.ws_limits import SocketGate
from services.fence.control_rate import ControlRate
from services.fence.egress import OPEN_SOCKETS, Egress, close_sockets, track
from services.fence.gateway import Gateway
from services.fence.inputs import InputAppender, Stored
from services.fence.problems import problem, problem_body
from services.fence.sessions import Sessions

_log = structlog.get_logger("statefleet.fence.ingress")
WS_WINDOW = 64  # unanswered frames per WebSocket


class Envelope(msgspec.Struct, forbid_unknown_fields=True):
    kind: Literal["text", "action", "audio", "json", "clear", "segment_end"]
    data: msgspec.Raw
    # The client's id for the item: a resend with an id among the session's recent items is
    # answered with the first copy's seq (and "duplicate": true) and not stored again.
    id: Annotated[str, msgspec.Meta(min_length=1, max_length=128)] | None = None


_decoder = msgspec.json.Decoder(Envelope)
_text = msgspec.json.Decoder(str)  # a text item's data: checked to be a JSON string by `_parse`
# The first byte of the JSON value each kind may carry: text a string, audio a string or an object,
# the others an object.
_STRING, _OBJECT = b'"'[0], b"{"[0]
_EXPECTED_START = {"text": (_STRING,), "action": (_OBJECT,), "audio": (_STRING, _OBJECT), "json": (_OBJECT,),
                   "clear": (_OBJECT,), "segment_end": (_OBJECT,)}


class Ingress:
    def __init__(self, sessions: Sessions, appender: InputAppender, gateway: Gateway, egress: Egress, *,
                 max_item_bytes: int, max_pending_items: int, origins: Origins, sockets: SocketGate,
                 control_rate: ControlRate | None = None) -> None:
        self.sessions, self.appender, self.gateway, self.egress = sessions, appender, gateway, egress
        self.control_rate = control_rate or ControlRate(per_s=4.0, burst=8)
        self.origins, self.sockets = origins, sockets
        self.max_item_bytes = max_item_bytes
        self.max_pending_items = max_pending_items

    def app(self) -> web.Application:
        # Headroom over the item size for the envelope; the exact limit is checked per item.
        app = web.Application(client_max_size=self.max_item_bytes + 1024, middlewares=[_problems])
        app.router.add_post("/v1/sessions/{session_id}/items", self._post)
        app.router.add_get("/v1/sessions/{session_id}/ws", self._ws)
        app.router.add_get("/v1/sessions/{session_id}/output", self._output)
        app.router.add_get("/healthz", self._health)
        app[OPEN_SOCKETS] = weakref.WeakSet()
        app.on_shutdown.append(close_sockets)
        return app

    async def accept(self, session_id: str, token: str | None, body: bytes) -> Stored:
        """Authenticate, validate, bound and durably store one item; returns it with its seq."""
        return await (await self.submit(session_id, token, body))

    async def submit(self, session_id: str, token: str | None, body: bytes) -> asyncio.Future[Stored]:
        """Authenticate, validate and bound one item, then queue it for storing (in call order)."""
        session_log.check_session_id(session_id)
        meta = await self.sessions.authenticate(session_id, token)
        kind, data, item_id = self._parse(body)
        _check_backend_takes(meta, kind, data)
        _check_voice_item(kind, data, self.max_item_bytes)
        await self._check_bound(session_id)
        if kind in voice_items.CONTROL_KINDS:  # last: a refused item spends none of the session's rate
            self.control_rate.take(session_id, kind)
        return self.appender.submit(session_id, kind, data, time.time(), item_id)

    def _parse(self, body: bytes) -> tuple[str, bytes, str]:
        if len(body) > self.max_item_bytes + 1024:
            raise errors.TooLarge(f"item is {len(body)} bytes", max_item_bytes=self.max_item_bytes)
        try:
            env = _decoder.decode(body)
        except msgspec.DecodeError as e:
            raise errors.SchemaError(f"malformed item: {e}") from None
        data = bytes(env.data)
        if len(data) > self.max_item_bytes:
            raise errors.TooLarge(f"item data is {len(data)} bytes (max {self.max_item_bytes})",
                                  size=len(data), max_item_bytes=self.max_item_bytes)
        if not data or data[0] not in _EXPECTED_START[env.kind]:
            raise errors.BadRequest(f"a {env.kind} item needs "
                                    f"{'a JSON string' if env.kind == 'text' else 'a JSON object'}"
                                    f"{' or string' if env.kind == 'audio' else ''}")
        return env.kind, data, env.id or ""

    async def _check_bound(self, session_id: str) -> None:
        """At most `max_pending_items` stored or queued but unreleased items per session (e.g. while unclaimed)."""
        last, unstored = self.appender.last_seq(session_id), self.appender.unstored(session_id)
        if last is None:  # no store since start: the writer reads the stored tail itself
            waiting = unstored
        else:
            waiting = last + unstored - await self.gateway.released(session_id)
            if waiting >= self.max_pending_items:  # the cached release cursor may be behind: ask the log
                waiting = last + unstored - await self.gateway.released(session_id, fresh=True)
        if waiting >= self.max_pending_items:
            raise errors.Busy(f"{self.max_pending_items} items already wait for this session (its engine has not "
                              "caught up, or it is not claimed yet); retry", session_id=session_id,
                              max_pending_items=self.max_pending_items, retry_after_s=1)

    # -------------------------------------------------------------- HTTP

    async def _post(self, request: web.Request) -> web.Response:
        session_id = request.match_info["session_id"]
        try:
            body = await request.read()
            item = await self.accept(session_id, _bearer(request), body)
        except web.HTTPRequestEntityTooLarge:
            return problem(errors.TooLarge("item too large", max_item_bytes=self.max_item_bytes))
        except errors.StatefleetError as e:
            return problem(e)
        except Exception:
            return problem(_internal(session_id))
        return web.json_response({"session_id": session_id, **_answer(item)})

    async def _ws(self, request: web.Request) -> web.StreamResponse:
        session_id = request.match_info["session_id"]
        token = _bearer(request)
        try:
            session_log.check_session_id(session_id)
            self.origins.check(request)
            if token is not None:
                await self.sessions.authenticate(session_id, token)
            self.sockets.take()
        except errors.StatefleetError as e:
            return problem(e)
        try:
            return await self._serve_input(request, session_id, token)
        finally:
            self.sockets.give()

    async def _serve_input(self, request: web.Request, session_id: str, token: str | None) -> web.WebSocketResponse:
        ws = track(request, web.WebSocketResponse(max_msg_size=self.max_item_bytes + 1024))
        if token is None:
            token = await authenticate_first_message(
                request, ws, lambda t: self.sessions.authenticate(session_id, t), problem_body)
            if token is None:
                return ws
            await ws.send_json({"authenticated": True})
        else:
            await ws.prepare(request)
        # Frames are validated and queued in order here; a second task answers them in the same order
        # as their stores complete, so the socket keeps up to WS_WINDOW items in flight.
        answers: asyncio.Queue[asyncio.Future[Stored] | errors.StatefleetError | None] = \
            asyncio.Queue(WS_WINDOW)
        answering = asyncio.create_task(self._answer(request, ws, session_id, answers))
        try:
            while (msg := await self.sockets.receive(request, ws)) is not None:
                if msg.type not in (WSMsgType.TEXT, WSMsgType.BINARY):
                    break
                body = msg.data.encode() if msg.type == WSMsgType.TEXT else msg.data
                try:
                    answer = await self.submit(session_id, token, body)
                except errors.StatefleetError as e:
                    answer = e
                except Exception:
                    answer = _internal(session_id)
                await answers.put(answer)
            await answers.put(None)
            await answering
        finally:
            answering.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await answering
        return ws

    async def _answer(self, request: web.Request, ws: web.WebSocketResponse, session_id: str,
                      answers: asyncio.Queue) -> None:
        while (answer := await answers.get()) is not None:
            if isinstance(answer, asyncio.Future):
                try:
                    answer = _answer(await answer)
                except errors.StatefleetError as e:
                    answer = e
                except Exception:
                    answer = _internal(session_id)
            if isinstance(answer, errors.StatefleetError):
                answer = {"error": problem_body(answer)}
            if ws.closed:
                continue  # the client went away: still wait for what it sent, so nothing is cut mid-store
            await self.sockets.send(request, ws, msgspec.json.encode(answer).decode())

    async def _output(self, request: web.Request) -> web.StreamResponse:
        try:
            self.origins.check(request)
            return await self.egress.handle(request, _bearer(request))
        except errors.StatefleetError as e:
            return problem(e)

    async def _health(self, _: web.Request) -> web.Response:
        return web.json_response({"ok": True})


def _check_backend_takes(meta: SessionMeta, kind: str, data: bytes) -> None:
    """Refuse what the session's backend would refuse (the kinds and size it declared at registration),
    so a client hears it now rather than finding the item skipped on the output stream."""
    if meta.input_kinds and kind not in meta.input_kinds:
        raise errors.UnsupportedInput(f"backend {meta.backend} takes {'/'.join(meta.input_kinds)} items, not {kind}",
                                      session_id=meta.session_id, kind=kind, field="kind")
    if meta.max_input_bytes:
        size = len(_text.decode(data).encode()) if kind == "text" else len(data)
        if size > meta.max_input_bytes:
            raise errors.TooLarge(f"a {kind} item of {size} bytes is over backend {meta.backend}'s "
                                  f"{meta.max_input_bytes}", size=size, max_input_bytes=meta.max_input_bytes)


def _check_voice_item(kind: str, data: bytes, max_item_bytes: int) -> None:
    """Audio and the control items have one valid form for every backend (libs/voice_items.py): a bad
    one is refused here with a typed 4xx rather than stored and skipped at the engine."""
    if kind == "audio":
        voice_items.audio_pcm(data, max_samples=max_item_bytes // 2)
    elif kind in voice_items.CONTROL_KINDS:
        voice_items.control(kind, data)


@web.middleware
async def _problems(request: web.Request, handler) -> web.StreamResponse:
    """What the router and body reader refuse (no such route, a wrong method, too large) leaves as
    problem+json too, like every error of the handlers."""
    try:
        return await handler(request)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        code = {404: "not_found", 405: "method_not_allowed", 413: "too_large"}.get(e.status, "bad_request")
        body = {"type": f"urn:statefleet:error:{code}", "title": code, "status": e.status, "detail": e.reason,
                "code": code, "retryable": False}
        return web.json_response(body, status=e.status, content_type="application/problem+json")


def _answer(stored: Stored) -> dict:
    return {"seq": stored.seq, "duplicate": True} if stored.duplicate else {"seq": stored.seq}


def _bearer(request: web.Request) -> str | None:
    """The header token; None when there is no header (a browser authenticates in its first message);
    "" (which no session's token matches) for a header that is not a bearer token."""
    value = request.headers.get("Authorization")
    if value is None:
        return None
    return value[7:] if value.startswith("Bearer ") else ""


def _internal(session_id: str) -> errors.Internal:
    error_id = uuid.uuid4().hex[:12]
    _log.exception("ingress_failed", session_id=session_id, error_id=error_id)
    return errors.Internal("internal error", error_id=error_id)
