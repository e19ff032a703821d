"""Admission's limits: creating needs a credential, tenants have a quota and see only their own
sessions, and a session that times out in the queue is closed at fence (its token stops working)."""

from __future__ import annotations

import asyncio

import aiohttp

from libs.fence.ownership import read_owner
from tests.support.admission import (  # noqa: F401
    ADMIN_TOKEN,
    admission_config,
    body,
    fleet,
    placement,
    problem,
    sees,
    start_admission,
)
from tests.support.waiting import eventually


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def test_credentials_quota_and_tenant_isolation(start_admission, placement, fleet):  # noqa: F811
    svc = await start_admission(api_keys={"acme": "acme-key", "umbrella": "umbrella-key"},
                                max_sessions_per_tenant=1, queue_capacity=8)
    await fleet.beat("h0")
    await sees(svc)
    async with aiohttp.ClientSession(f"http://127.0.0.1:{svc.http_port}") as http:
        for headers in ({}, auth("wrong"), {"Authorization": "Basic acme-key"}):
            await problem(await http.post("/v1/sessions", json=body(), headers=headers), 401)
        first = await http.post("/v1/sessions", json=body(), headers=auth("acme-key"))
        assert first.status in (201, 202), await first.text()
        sid = (await first.json())["session_id"]
        p = await problem(await http.post("/v1/sessions", json=body(), headers=auth("acme-key")), 429)
        assert p["reason"] == "tenant_quota"
        # another tenant neither sees nor deletes it, and is told exactly what a missing id gets
        other = await problem(await http.get(f"/v1/sessions/{sid}", headers=auth("umbrella-key")), 404)
        missing = await problem(await http.get(f"/v1/sessions/{'0' * 32}", headers=auth("umbrella-key")), 404)
        assert other["code"] == missing["code"]
        await problem(await http.delete(f"/v1/sessions/{sid}", headers=auth("umbrella-key")), 404)
        await problem(await http.delete(f"/v1/sessions/{sid}"), 401)
        assert (await http.get(f"/v1/sessions/{sid}", headers=auth(ADMIN_TOKEN))).status == 200
        assert (await http.delete(f"/v1/sessions/{sid}", headers=auth("acme-key"))).status == 204
        again = await http.post("/v1/sessions", json=body(), headers=auth("acme-key"))  # the quota freed up
        assert again.status in (201, 202), await again.text()


async def test_a_session_timed_out_in_the_queue_is_closed_at_fence(start_admission, placement, fleet,  # noqa: F811
                                                                    fence):  # noqa: F811
    svc = await start_admission(queue_timeout_s=0.5)
    await fleet.beat("h0", busy=0.85)  # nothing fits: the session waits, then times out
    await sees(svc)
    async with aiohttp.ClientSession(f"http://127.0.0.1:{svc.http_port}", headers=auth(ADMIN_TOKEN)) as http:
        created = await (await http.post("/v1/sessions", json=body())).json()
        sid, token = created["session_id"], created["input_token"]

        async def closed():
            return (await read_owner(svc.js, sid)).view.closed

        await eventually(closed)
        async with aiohttp.ClientSession(f"http://127.0.0.1:{fence.http_port}") as ingress:
            late = await ingress.post(f"/v1/sessions/{sid}/items", json={"kind": "action", "data": {}},
                                      headers=auth(token))
            assert (await problem(late, 409))["code"] == "conflict"


async def test_a_c1_period_the_backend_cannot_stream_is_refused_or_completed(start_admission, placement,  # noqa: F811
                                                                            fleet):  # noqa: F811
    svc = await start_admission()
    await fleet.beat("h0")  # its rows: 100 ms of media per block
    await sees(svc)
    async with aiohttp.ClientSession(f"http://127.0.0.1:{svc.http_port}", headers=auth(ADMIN_TOKEN)) as http:
        p = await problem(await http.post("/v1/sessions", json=body(period_ms=150.0)), 422)
        assert p["field"] == "period_ms" and "0.67x real time" in p["detail"]
        resp = await http.post("/v1/sessions", json=body(period_ms=None))
        assert resp.status in (201, 202), await resp.text()
        assert (await resp.json())["contract"]["period_ms"] == 100.0


async def test_the_api_sheds_connections_and_slow_heads_typed(start_admission, placement):  # noqa: F811
    """The same guard fronts admission: one connection over the cap is a 503 problem+json (in the
    document as every operation's 503), a trickled head a 408; a normal request is served after."""
    svc = await start_admission(http_max_connections=2, http_head_timeout_s=0.5)
    held = [await asyncio.open_connection("127.0.0.1", svc.http_port) for _ in range(2)]
    reader, writer = await asyncio.open_connection("127.0.0.1", svc.http_port)
    answer = await asyncio.wait_for(reader.read(), 5.0)
    writer.close()
    assert answer.startswith(b"HTTP/1.1 503") and b"application/problem+json" in answer
    for _, w in held:
        w.close()
    await asyncio.sleep(0.1)
    reader, writer = await asyncio.open_connection("127.0.0.1", svc.http_port)
    writer.write(b"GET /v1/sessions/" + b"0" * 32 + b" HTTP/1.1\r\nHost: x\r\n")  # and never the blank line
    answer = await asyncio.wait_for(reader.read(), 5.0)
    writer.close()
    assert answer.startswith(b"HTTP/1.1 408") and b"request_timeout" in answer
    async with aiohttp.ClientSession(f"http://127.0.0.1:{svc.http_port}") as http:
        await problem(await http.get("/v1/sessions/" + "0" * 32, headers=auth(ADMIN_TOKEN)), 404)
