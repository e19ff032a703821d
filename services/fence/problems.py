"""The problem+json shape every fence HTTP answer and socket error takes: the typed error's code, no traceback."""

from __future__ import annotations

from aiohttp import web

from libs import errors


def problem_body(e: errors.StatefleetError) -> dict:
    status = e.http_status
    fields = {k: v for k, v in e.fields.items() if isinstance(v, (str, int, float, bool))}
    return {"type": f"urn:statefleet:error:{e.code}", "title": e.code, "status": status, "detail": e.detail,
            "code": e.code, "retryable": e.retryable, **fields}


def problem(e: errors.StatefleetError) -> web.Response:
    body = problem_body(e)
    retry = e.fields.get("retry_after_s")
    headers = {"Retry-After": str(max(1, round(retry)))} if isinstance(retry, int | float) else None
    return web.json_response(body, status=body["status"], content_type="application/problem+json", headers=headers)
