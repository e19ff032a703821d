"""Admission hands sessions to fence: registered at create (token), assigned when placed, closed on delete."""

from __future__ import annotations

import aiohttp

from libs.fence.ownership import read_owner
from tests.support.admission import body, problem, sees
from tests.support.fence import stored_items
from tests.support.waiting import eventually


async def test_placed_session_is_registered_and_assigned_to_its_host(http, admission, fleet, fence):
    await fleet.beat("h0")
    await sees(admission)
    resp = await http.post("/v1/sessions", json=body())
    assert resp.status == 201, await resp.text()
    created = await resp.json()
    sid, token = created["session_id"], created["input_token"]
    assert len(token) >= 32 and token not in str(await (await http.get(f"/v1/sessions/{sid}")).text())
    assert created["input_url"].endswith(f"/v1/sessions/{sid}/items")
    assert created["output_ws_url"].startswith("ws://")

    tail = await read_owner(admission.js, sid)
    assert tail.view.owner.server_id == "h0" and tail.view.owner.version == 1
    view = await (await http.get(f"/v1/sessions/{sid}")).json()
    assert (view["owner_server_id"], view["owner_version"], view["claimed"]) == ("h0", 1, False)

    # the token admission handed out is the one fence's ingress accepts
    async with aiohttp.ClientSession(f"http://127.0.0.1:{fence.http_port}") as ingress:
        ok = await ingress.post(f"/v1/sessions/{sid}/items", json={"kind": "text", "data": "hello"},
                                headers={"Authorization": f"Bearer {token}"})
        assert ok.status == 200, await ok.text()
        assert await ok.json() == {"session_id": sid, "seq": 1}  # stored: acknowledged with its seq
        bad = await ingress.post(f"/v1/sessions/{sid}/items", json={"kind": "text", "data": "x"},
                                 headers={"Authorization": "Bearer wrong"})
        assert bad.status == 401

        assert (await http.delete(f"/v1/sessions/{sid}")).status == 204
        late = await ingress.post(f"/v1/sessions/{sid}/items", json={"kind": "text", "data": "late"},
                                  headers={"Authorization": f"Bearer {token}"})
        assert (await problem(late, 409))["code"] == "conflict"  # known session, closed: refused
    assert (await read_owner(admission.js, sid)).view.closed
    assert await stored_items(admission.js, sid) == []  # a closed session's input is purged; "late" never stored


async def test_queued_session_gets_its_token_now_and_its_assignment_when_placed(http, admission, fleet):
    await fleet.beat("h0", busy=0.85)
    await sees(admission)
    resp = await http.post("/v1/sessions", json=body())
    assert resp.status == 202
    created = await resp.json()
    assert created["input_token"] and created["owner_version"] == 0
    await fleet.beat("h0", busy=0.0)

    async def assigned():
        return (await read_owner(admission.js, created["session_id"])).view.owner

    owner = await eventually(assigned)
    assert owner.server_id == "h0"


async def test_fence_down_refuses_create_and_records_nothing(http, admission, fleet, fence):
    await fleet.beat("h0")
    await sees(admission)
    await fence.stop()
    p = await problem(await http.post("/v1/sessions", json=body()), 503)
    assert p["retryable"]
    assert admission.core.waiting() == []
