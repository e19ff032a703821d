"""The OpenAPI 3.1 document of the session API, generated from the msgspec Structs it speaks."""

from __future__ import annotations

from typing import Any

import msgspec

from libs.schemas.admission import (
    SESSION_ID_PATTERN,
    CreatedSession,
    CreateSession,
    FleetView,
    MoveBody,
    Problem,
    QueueView,
    SessionStatus,
)
from libs.schemas.motion import MoveReceipt
from libs.schemas.placement import HOST_ID_PATTERN, DrainReport, HostInfo, HostList

_REF = "#/components/schemas/{name}"
_, _COMPONENTS = msgspec.json.schema_components([CreateSession, CreatedSession, SessionStatus, QueueView, FleetView,
                                                  HostList, HostInfo, DrainReport, MoveBody, MoveReceipt,
                                                  Problem],
                                                 ref_template=_REF)


def _ref(typ: type) -> dict[str, str]:
    return {"$ref": _REF.format(name=typ.__name__)}


def _body(typ: type, description: str, media: str = "application/json") -> dict[str, Any]:
    return {"description": description, "content": {media: {"schema": _ref(typ)}}}


def _problems(*statuses: int) -> dict[str, Any]:
    out = {str(s): _body(Problem, "the failure, naming the field", "application/problem+json")
           for s in sorted({*statuses, *_SHED, 400})}
    # A request head that does not parse (a malformed header line) is answered by aiohttp's HTTP parser
    # before any route or middleware sees it: a 400 in plain text, so every route documents that too.
    out["400"]["content"]["text/plain"] = {"schema": {"type": "string"}}
    return out


_SESSION_ID = {"name": "session_id", "in": "path", "required": True,
               "schema": {"type": "string", "pattern": SESSION_ID_PATTERN}}
_ADMIN = [{"adminToken": []}]
# The session routes take a tenant's API key or the admin token (either as a bearer token); a stack
# configured with neither is a development stack and leaves them open (services/admission/auth.py).
_SESSIONS = [{"apiKey": []}, {"adminToken": []}]
# Any route may be shed before it is routed: too many connections (503), a request head or body
# that did not arrive in time (408); see libs/http_limits.py.
_SHED = (408, 503)
_HOST_ID = {"name": "host_id", "in": "path", "required": True, "schema": {"type": "string", "pattern": HOST_ID_PATTERN}}

OPENAPI: dict[str, Any] = {
    "openapi": "3.1.0",
    "info": {"title": "statefleet admission", "version": "1",
             "description": "Session lifecycle: admitted against a contract, placed on an engine host."},
    "paths": {
        "/v1/sessions": {"post": {
            "operationId": "createSession",
            "summary": "Admit a session against its contract and place it, or queue it", "security": _SESSIONS,
            "requestBody": {"required": True, "content": {"application/json": {"schema": _ref(CreateSession)}}},
            "responses": {"201": _body(CreatedSession, "admitted, placed and assigned to an engine host"),
                          "202": _body(CreatedSession, "registered, waiting in the admission queue"),
                          **_problems(400, 401, 413, 422, 429, 503)},
        }},
        "/v1/sessions/{session_id}": {
            "parameters": [_SESSION_ID],
            "get": {"operationId": "getSession", "summary": "A session's state, host and metrics",
                    "security": _SESSIONS,
                    "responses": {"200": _body(SessionStatus, "the session"), **_problems(400, 401, 404, 503)}},
            "delete": {"operationId": "deleteSession", "summary": "Forget a session (queued or placed)",
                       "security": _SESSIONS,
                       "responses": {"204": {"description": "deleted"}, **_problems(400, 401, 404, 503)}},
        },
        "/v1/admin/queue": {"get": {
            "operationId": "adminQueue", "summary": "The admission queue", "security": _ADMIN,
            "responses": {"200": _body(QueueView, "the queue, head first"), **_problems(401, 403)}}},
        "/v1/admin/fleet": {"get": {
            "operationId": "adminFleet", "summary": "Live engine hosts and pending placements", "security": _ADMIN,
            "responses": {"200": _body(FleetView, "the hosts admission sees"), **_problems(401, 403)}}},
        "/v1/admin/hosts": {"get": {
            "operationId": "adminHosts", "summary": "Engine hosts as placement sees them: up, draining, drained, dead",
            "security": _ADMIN,
            "responses": {"200": _body(HostList, "every host placement knows"), **_problems(401, 403, 503)}}},
        "/v1/admin/hosts/{host_id}/drain": {"parameters": [_HOST_ID], "post": {
            "operationId": "adminDrainHost", "security": _ADMIN,
            "summary": "Stop placing on a host and move every session off it (live, or by checkpoint + replay)",
            "responses": {"200": _body(DrainReport, "each session's outcome; state drained once empty"),
                          **_problems(400, 401, 403, 404, 503, 504)}}},
        "/v1/admin/hosts/{host_id}/undrain": {"parameters": [_HOST_ID], "post": {
            "operationId": "adminUndrainHost", "summary": "Let a drained host take sessions again",
            "security": _ADMIN,
            "responses": {"200": _body(HostInfo, "the host"), **_problems(400, 401, 403, 404, 503)}}},
        "/v1/admin/sessions/{session_id}/move": {"parameters": [_SESSION_ID], "post": {
            "operationId": "adminMoveSession", "security": _ADMIN,
            "summary": "Move a session live from its owner to another engine host, through the mover",
            "requestBody": {"required": True, "content": {"application/json": {"schema": _ref(MoveBody)}}},
            "responses": {"200": _body(MoveReceipt, "the mover's receipt, whatever the outcome"),
                          **_problems(400, 401, 403, 404, 413, 503, 504)}}},
    },
    "components": {
        "schemas": _COMPONENTS,
        "securitySchemes": {
            "adminToken": {"type": "http", "scheme": "bearer",
                           "description": "The operator's admin token (`var/admin_token` under `statefleet up`)"},
            "apiKey": {"type": "http", "scheme": "bearer",
                       "description": "A tenant's API key (admission's `api_keys`); its sessions only"},
        },
    },
}
