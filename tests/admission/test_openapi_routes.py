"""The OpenAPI document and the routes admission serves agree, in both directions.

Every JSON route of the running server is in the document with its method and every operation in
the document is routed; an operation that takes a body documents 413; an operation that declares a
security requirement answers 401 without a credential (and documents it), and one that declares
none answers without one. Only the pages, their scripts and the fleet feed's WebSocket (which
OpenAPI cannot describe) are outside the document, and they are named here.
"""

from __future__ import annotations

import io
import re

import aiohttp

from services.admission.openapi import OPENAPI

NOT_IN_DOCUMENT = {("GET", "/"), ("GET", "/session"), ("GET", "/dashboard"), ("GET", "/static/{name}"),
                   ("GET", "/v1/admin/feed"), ("GET", "/openapi.json")}
EXAMPLE = {"session_id": "0" * 32, "host_id": "h0", "name": "x"}


def _documented() -> dict[tuple[str, str], dict]:
    return {(method.upper(), path): op for path, item in OPENAPI["paths"].items()
            for method, op in item.items() if method != "parameters"}


def _routed(app) -> set[tuple[str, str]]:
    return {(r.method, r.resource.canonical) for r in app.router.routes() if r.method != "HEAD"}


async def test_every_route_is_documented_and_every_operation_routed(admission):
    routed = _routed(admission._runner.app)
    assert routed - NOT_IN_DOCUMENT == set(_documented()), (routed - NOT_IN_DOCUMENT) ^ set(_documented())
    assert NOT_IN_DOCUMENT <= routed  # the exceptions are real routes, not stale names


def test_bodies_document_413_and_secured_operations_401():
    schemes = set(OPENAPI["components"]["securitySchemes"])
    for (method, path), op in _documented().items():
        statuses = set(op["responses"])
        if "requestBody" in op:
            assert "413" in statuses, (method, path)
        for requirement in op.get("security", []):
            assert set(requirement) <= schemes, (method, path, requirement)
            assert "401" in statuses, (method, path)
        assert {"503", "408"} <= statuses, (method, path)  # shed before routing: libs/http_limits.py


async def test_declared_security_is_what_the_server_enforces(admission):
    base = f"http://127.0.0.1:{admission.http_port}"
    async with aiohttp.ClientSession() as http:
        for (method, path), op in _documented().items():
            url = base + re.sub(r"\{(\w+)\}", lambda m: EXAMPLE[m.group(1)], path)
            async with http.request(method, url, json={}) as resp:
                if op.get("security"):
                    assert resp.status == 401, (method, path, resp.status)
                    assert resp.content_type == "application/problem+json"
                else:
                    assert resp.status != 401, (method, path)


async def test_an_oversized_body_is_a_documented_413(admission):
    base = f"http://127.0.0.1:{admission.http_port}"
    headers = {"Authorization": "Bearer test-admin-token"}
    async with aiohttp.ClientSession(headers=headers) as http:
        for (method, path), op in _documented().items():
            if "requestBody" not in op:
                continue
            url = base + re.sub(r"\{(\w+)\}", lambda m: EXAMPLE[m.group(1)], path)
            async with http.request(method, url, data=io.BytesIO(b"{" + b" " * (1 << 20) + b"}")) as resp:
                assert resp.status == 413, (method, path, resp.status)
                assert resp.content_type == "application/problem+json"
