"""Ingress and the session verbs: bad input gets a typed error, appends nothing, and the service stays up."""

from __future__ import annotations

import pytest

from libs import bus, errors
from libs.fence import ownership, session_log
from libs.schemas.fence import CheckpointRequest, CloseReply, CloseRequest, MetaRequest, SessionMeta
from services.fence.input_reads import read_items
from tests.support.fence import engine, post, register, start_fence
from tests.support.waiting import eventually


async def stored(nc, session_id: str) -> list[int]:
    return [i.seq for i, _ in await read_items(nc.jetstream(), session_id, 0, 0, max_items=10_000,
                                                max_bytes=1 << 30)]


async def test_bad_items_get_problem_json_and_store_nothing(fence, nc, http):
    token = await register(nc, "s1")
    big = {"kind": "text", "data": "x" * (fence.config.max_item_bytes + 10)}
    cases = [
        ("s1", token, b"{not json", 400, "schema"),
        ("s1", token, {"kind": "video", "data": "x"}, 400, "schema"),
        ("s1", token, {"kind": "text", "data": {"a": 1}}, 400, "bad_request"),
        ("s1", token, {"kind": "action", "data": "w"}, 400, "bad_request"),
        ("s1", token, {"kind": "text", "data": "x", "extra": 1}, 400, "schema"),
        ("s1", token, big, 413, "too_large"),
        ("s1", None, {"kind": "text", "data": "x"}, 401, "unauthorized"),
        ("s1", token + "x", {"kind": "text", "data": "x"}, 401, "unauthorized"),
        ("nope", token, {"kind": "text", "data": "x"}, 401, "unauthorized"),  # as a wrong token: no oracle
        ("bad.id", token, {"kind": "text", "data": "x"}, 400, "bad_request"),
    ]
    for sid, tok, body, status, code in cases:
        got, problem = await post(http, fence, sid, tok, body)
        assert (got, problem["code"]) == (status, code), (body if not isinstance(body, dict) else body["kind"])
        assert token not in str(problem)
    assert await stored(nc, "s1") == []
    got, ok = await post(http, fence, "s1", token, {"kind": "json", "data": {"k": [1, 2]}})
    assert got == 200 and ok["seq"] == 1
    assert await stored(nc, "s1") == [1]


async def test_websocket_acks_each_item_and_survives_bad_frames(fence, nc, http):
    token = await register(nc, "ws1")
    url = f"http://127.0.0.1:{fence.http_port}/v1/sessions/ws1/ws"
    async with http.ws_connect(url, headers={"Authorization": f"Bearer {token}"}) as ws:
        await ws.send_str('{"kind": "text", "data": "a"}')
        assert await ws.receive_json() == {"seq": 1}
        await ws.send_str("garbage")
        assert (await ws.receive_json())["error"]["code"] == "schema"
        await ws.send_str('{"kind": "action", "data": {"keys": ["w"]}}')
        assert await ws.receive_json() == {"seq": 2}
    async with http.get(url, headers={"Authorization": "Bearer wrong"}) as resp:
        assert resp.status == 401
    assert await stored(nc, "ws1") == [1, 2]


async def test_unclaimed_session_waits_bounded_then_busy_and_nothing_is_lost(nats_server, nc, http):
    fence = await start_fence(nats_server.url, "fence-b", max_pending_items=5)
    try:
        token = await register(nc, "w1")
        a = await ownership.assign(nc, "w1", "e1")  # assigned, not claimed
        codes = [(await post(http, fence, "w1", token, {"kind": "text", "data": str(i)}))[0] for i in range(8)]
        assert codes == [200] * 5 + [429] * 3
        eng = await engine(nc, "e1")
        await eng.adopt("w1", a.version)
        await eventually(lambda: eng.state["w1"] == [1, 2, 3, 4, 5])
        status, body = await post(http, fence, "w1", token, {"kind": "text", "data": "more"})
        assert status == 200 and body["seq"] == 6
        await eventually(lambda: eng.state["w1"] == [1, 2, 3, 4, 5, 6])
        await eng.stop()
    finally:
        await fence.stop()


async def test_verbs_refuse_bad_requests_and_append_nothing(fence, nc):
    js = nc.jetstream()
    await register(nc, "v1")
    with pytest.raises(errors.Conflict):
        await register(nc, "v1")
    with pytest.raises(errors.BadRequest):
        await register(nc, "has space")
    with pytest.raises(errors.NotFound):
        await bus.request(nc, "sf.fence.meta", MetaRequest(session_id="missing"), SessionMeta)
    garbage = await nc.request("sf.fence.meta", b"\xc1", timeout=2)
    assert garbage.headers[bus.ERROR_HEADER] == "schema"
    a = await ownership.assign(nc, "v1", "e1")
    e1, e2 = await engine(nc, "e1"), await engine(nc, "e2")
    before = (await session_log.read_tail(js, "v1")).seq
    with pytest.raises(errors.Conflict):
        await e2.client.claim("v1", a.version, 0)  # not assigned to e2
    with pytest.raises(errors.Conflict):
        await e1.client.claim("v1", a.version + 1, 0)  # not an assigned version
    with pytest.raises(errors.Conflict):
        await ownership.assign(nc, "v1", "e2", expect_version=a.version - 1)  # stale view
    with pytest.raises(errors.Conflict):  # a checkpoint from a server that does not hold the claim
        await bus.request(nc, "sf.fence.checkpoint", CheckpointRequest(
            session_id="v1", server_id="e1", version=a.version, ref="r", cursor=0), SessionMeta)
    assert (await session_log.read_tail(js, "v1")).seq == before
    lease = await e1.client.claim("v1", a.version, 0)
    with pytest.raises(errors.Conflict):
        await e1.client.claim("v1", a.version, 0)  # duplicate claim
    b = await ownership.assign(nc, "v1", "e2", expect_version=a.version)
    await eventually(lambda: lease.revoked.is_set())
    with pytest.raises(errors.Conflict):
        await e1.client.claim("v1", a.version, 0)  # stale version after the newer assign
    assert (await ownership.read_owner(js, "v1")).view.owner.version == b.version
    await e1.stop()
    await e2.stop()


async def test_close_stops_ingress_and_revokes(fence, nc, http):
    token = await register(nc, "c1")
    a = await ownership.assign(nc, "c1", "e1")
    eng = await engine(nc, "e1")
    lease = await eng.adopt("c1", a.version)
    assert (await post(http, fence, "c1", token, {"kind": "text", "data": "x"}))[0] == 200
    await eventually(lambda: eng.state["c1"] == [1])
    await bus.request(nc, "sf.fence.close", CloseRequest(session_id="c1"), CloseReply)
    await eventually(lambda: lease.revoked.is_set())
    status, problem = await post(http, fence, "c1", token, {"kind": "text", "data": "y"})
    assert (status, problem["code"]) == (409, "conflict")
    summary = await (await nc.jetstream().key_value("sf_sessions")).get("c1")
    assert b"closed" in summary.value
    await eng.stop()
