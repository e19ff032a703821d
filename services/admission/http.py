"""The session API over HTTP (aiohttp): thin handlers, every error as `application/problem+json`.

Routes (the OpenAPI document at `/openapi.json` is the contract):
  POST   /v1/sessions                 CreateSession → 201 CreatedSession (placed) | 202 CreatedSession (queued)
  GET    /v1/sessions/{session_id}    → SessionStatus
  DELETE /v1/sessions/{session_id}    → 204
  (the session routes: Authorization: Bearer <API key or admin token> when any is configured; auth.py)
  GET    /v1/admin/queue              → QueueView   (Authorization: Bearer <admin_token>)
  GET    /v1/admin/fleet              → FleetView   (Authorization: Bearer <admin_token>)
  GET    /v1/admin/hosts              → HostList    (admin; placement's view: up/draining/drained/dead)
  POST   /v1/admin/hosts/{host_id}/drain    → DrainReport (admin; answers once the host is empty)
  POST   /v1/admin/hosts/{host_id}/undrain  → HostInfo    (admin)
"""

from __future__ import annotations

import re
import uuid
from http import HTTPStatus
from typing import Any, Protocol

import msgspec
import structlog
from aiohttp import web

from libs import init_inputs
from libs.errors import BadRequest, Forbidden, Internal, NotFound, StatefleetError, Unauthorized
from libs.schemas.admission import (
    BACKEND_PATTERN,
    SESSION_ID_PATTERN,
    AdmissionVerdict,
    CreatedSession,
    CreateSession,
    FleetView,
    Problem,
    QueueView,
    SessionStatus,
)
from libs.schemas.base import check_version
from libs.schemas.placement import HOST_ID_PATTERN, DrainReport, HostInfo, HostList
from services.admission.auth import Caller, Credentials
from services.admission.openapi import OPENAPI

log = structlog.get_logger("statefleet.admission.http")
PROBLEM = "application/problem+json"
_SESSION_ID = re.compile(SESSION_ID_PATTERN.strip("^$"))  # fullmatch: `$` admits a trailing newline
_BACKEND = re.compile(BACKEND_PATTERN.strip("^$"))
# a create body: contract, prompt (at most MAX_PROMPT_CHARS) and init media as base64 (4/3 of their bytes)
MAX_BODY_BYTES = 256 * 1024 + init_inputs.MAX_INIT_BYTES * 4 // 3 + 4
MAX_BODY_DEPTH = 32
_HOST_ID = re.compile(HOST_ID_PATTERN.strip("^$"))
_FIELD = re.compile(r"at `\$\.?([^`]*)`")
_UNKNOWN = re.compile(r"unknown field `([^`]+)`")


class SessionApi(Protocol):
    async def create(self, req: CreateSession, caller: Caller) -> tuple[int, CreatedSession]: ...
    async def get(self, session_id: str, caller: Caller) -> SessionStatus: ...
    async def delete(self, session_id: str, caller: Caller) -> None: ...
    def queue_view(self) -> QueueView: ...
    def fleet_view(self) -> FleetView: ...
    async def host_list(self) -> HostList: ...
    async def drain_host(self, host_id: str) -> DrainReport: ...
    async def undrain_host(self, host_id: str) -> HostInfo: ...


def make_app(api: SessionApi, credentials: Credentials, *, max_body_bytes: int = MAX_BODY_BYTES) -> web.Application:
    async def create(request: web.Request) -> web.Response:
        caller = credentials.caller(request)
        status, view = await api.create(parse_create(await request.read()), caller)
        return _json(view, status)

    async def get(request: web.Request) -> web.Response:
        sid = _session_id(request)
        return _json(await api.get(sid, credentials.caller(request)))

    async def delete(request: web.Request) -> web.Response:
        sid = _session_id(request)
        await api.delete(sid, credentials.caller(request))
        return web.Response(status=204)

    async def queue(request: web.Request) -> web.Response:
        credentials.admin(request)
        return _json(api.queue_view())

    async def fleet(request: web.Request) -> web.Response:
        credentials.admin(request)
        return _json(api.fleet_view())

    async def hosts(request: web.Request) -> web.Response:
        credentials.admin(request)
        return _json(await api.host_list())

    async def drain(request: web.Request) -> web.Response:
        credentials.admin(request)
        return _json(await api.drain_host(_host_id(request)))

    async def undrain(request: web.Request) -> web.Response:
        credentials.admin(request)
        return _json(await api.undrain_host(_host_id(request)))

    async def openapi(_: web.Request) -> web.Response:
        return web.json_response(OPENAPI)

    app = web.Application(middlewares=[problems], client_max_size=max_body_bytes)
    app.router.add_post("/v1/sessions", create)
    app.router.add_get("/v1/sessions/{session_id}", get, allow_head=False)
    app.router.add_delete("/v1/sessions/{session_id}", delete)
    app.router.add_get("/v1/admin/queue", queue, allow_head=False)
    app.router.add_get("/v1/admin/fleet", fleet, allow_head=False)
    app.router.add_get("/v1/admin/hosts", hosts, allow_head=False)
    app.router.add_post("/v1/admin/hosts/{host_id}/drain", drain)
    app.router.add_post("/v1/admin/hosts/{host_id}/undrain", undrain)
    app.router.add_get("/openapi.json", openapi, allow_head=False)
    return app


def parse_create(body: bytes) -> CreateSession:
    """Decode a create body; a `BadRequest` names the offending field as a dotted path."""
    try:
        raw = msgspec.json.decode(body)
    except msgspec.DecodeError as e:
        raise BadRequest(f"request body is not JSON: {e}", field="body") from None
    try:
        req = msgspec.convert(_integral(raw), CreateSession)
    except msgspec.ValidationError as e:
        raise BadRequest(f"invalid request body: {e}", field=_field_of(str(e))) from None
    if not _BACKEND.fullmatch(req.backend):  # the schema's `$` admits a trailing newline in Python
        raise BadRequest(f"backend must match {BACKEND_PATTERN}", field="backend")
    check_version(req)
    return req


def _integral(value: Any, depth: int = 0) -> Any:
    """JSON has one number type: 7.0 is a valid JSON Schema integer, so pass it on as 7.
    A create body is a few levels deep; one nested deeper is refused, not recursed into."""
    if depth > MAX_BODY_DEPTH:
        raise BadRequest(f"request body is nested deeper than {MAX_BODY_DEPTH} levels", field="body")
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _integral(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [_integral(v, depth + 1) for v in value]
    return value


def _field_of(message: str) -> str:
    path = m.group(1) if (m := _FIELD.search(message)) else ""
    if (u := _UNKNOWN.search(message)) is not None:
        path = f"{path}.{u.group(1)}" if path else u.group(1)
    return path or "body"


def _session_id(request: web.Request) -> str:
    sid = request.match_info["session_id"]
    if not _SESSION_ID.fullmatch(sid):
        raise BadRequest("session_id must be 32 lowercase hex digits", field="session_id")
    return sid


def _host_id(request: web.Request) -> str:
    host_id = request.match_info["host_id"]
    if not _HOST_ID.fullmatch(host_id):
        raise BadRequest("host_id must be 1-64 of [A-Za-z0-9_-]", field="host_id")
    return host_id


def _json(body: Any, status: int = 200) -> web.Response:
    return web.Response(body=msgspec.json.encode(body), status=status, content_type="application/json")


@web.middleware
async def problems(request: web.Request, handler) -> web.StreamResponse:
    """Every failure leaves as problem+json; an unexpected one says only its error id."""
    try:
        return await handler(request)
    except StatefleetError as e:
        return problem(e)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        return _problem_response(Problem(title=e.reason, status=e.status, detail=e.text or e.reason,
                                         code=HTTPStatus(e.status).name.lower()), e.headers)
    except Exception:
        error_id = uuid.uuid4().hex[:12]
        log.exception("http_handler_failed", path=request.path, error_id=error_id)
        return problem(Internal(f"internal error {error_id}", error_id=error_id))


def problem(e: StatefleetError) -> web.Response:
    f = e.fields
    fields = [x for x in str(f.get("fields", "")).split(",") if x] or ([f["field"]] if f.get("field") else [])
    verdict = f.get("verdict")
    body = Problem(title=HTTPStatus(e.http_status).phrase, status=e.http_status, detail=e.detail, code=e.code,
                   field=f.get("field") or None, fields=fields, reason=f.get("reason"), retryable=e.retryable,
                   verdict=verdict if isinstance(verdict, AdmissionVerdict) else None)
    headers = {"WWW-Authenticate": 'Bearer realm="statefleet-admin"'} if isinstance(e, Unauthorized) else {}
    if isinstance(e, NotFound | BadRequest | Unauthorized | Forbidden):
        log.info("http_client_error", code=e.code, detail=e.detail)
    return _problem_response(body, headers)


def _problem_response(body: Problem, headers: Any = None) -> web.Response:
    hdrs = {k: v for k, v in (headers or {}).items() if k.lower() not in ("content-type", "content-length")}
    return web.Response(body=msgspec.json.encode(body), status=body.status, content_type=PROBLEM, headers=hdrs)
