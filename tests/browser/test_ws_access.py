"""Session sockets as a browser opens them: the token in the first message, the Origin checked,
owner changes on the output socket. Header clients keep working (tests/fence)."""

from __future__ import annotations

import json

import aiohttp
import pytest

from libs import names, ws_auth
from libs.fence import ownership
from libs.schemas.base import decode, encode
from libs.schemas.engine import OutputChunk
from services.fence.egress import Outbox
from tests.support.fence import engine, register, start_fence

PAGE = "http://127.0.0.1:8700"


@pytest.fixture
async def fence(nats_server):
    service = await start_fence(nats_server.url, "fence-web", allowed_origins=f"{PAGE}, http://localhost:8700")
    yield service
    await service.stop()


def url(fence, sid: str, path: str) -> str:
    return f"http://127.0.0.1:{fence.http_port}/v1/sessions/{sid}/{path}"


async def test_input_socket_authenticates_by_first_message(fence, nc, http):
    token = await register(nc, "b1")
    async with http.ws_connect(url(fence, "b1", "ws"), origin=PAGE) as ws:
        await ws.send_json({"type": "auth", "token": token})
        assert await ws.receive_json(timeout=5) == {"authenticated": True}
        await ws.send_json({"kind": "text", "data": "<img src=x onerror=alert(1)>"})
        assert await ws.receive_json(timeout=5) == {"seq": 1}


@pytest.mark.parametrize("first", [
    json.dumps({"type": "auth", "token": "wrong"}),
    json.dumps({"kind": "text", "data": "no auth first"}),
    "not json",
], ids=["wrong-token", "item-first", "garbage"])
async def test_a_socket_that_does_not_authenticate_first_is_answered_and_closed(fence, nc, http, first):
    token = await register(nc, "b2")
    for path in ("ws", "output"):
        async with http.ws_connect(url(fence, "b2", path), origin=PAGE) as ws:
            await ws.send_str(first)
            answer = await ws.receive_json(timeout=5)
            assert answer["error"]["code"] == "unauthorized" and token not in json.dumps(answer)
            closed = await ws.receive(timeout=5)
            assert closed.type == aiohttp.WSMsgType.CLOSE and closed.data == ws_auth.CLOSE_UNAUTHORIZED


async def test_a_silent_socket_is_closed_after_the_auth_timeout(fence, nc, http, monkeypatch):
    monkeypatch.setattr(ws_auth, "AUTH_TIMEOUT_S", 0.2)
    await register(nc, "b3")
    async with http.ws_connect(url(fence, "b3", "ws"), origin=PAGE) as ws:
        assert (await ws.receive_json(timeout=5))["error"]["code"] == "unauthorized"
        assert (await ws.receive(timeout=5)).data == ws_auth.CLOSE_UNAUTHORIZED


async def test_a_foreign_origin_is_refused_before_the_handshake(fence, nc, http):
    token = await register(nc, "b4")
    for path in ("ws", "output"):
        for headers in ({}, {"Authorization": f"Bearer {token}"}):
            with pytest.raises(aiohttp.WSServerHandshakeError) as e:
                await http.ws_connect(url(fence, "b4", path), origin="http://evil.example", headers=headers)
            assert e.value.status == 403
    # its own origin and the configured ones are fine; so is a client that sends none
    for origin in (f"http://127.0.0.1:{fence.http_port}", "http://LOCALHOST:8700", None):
        async with http.ws_connect(url(fence, "b4", "ws"), origin=origin,
                                   headers={"Authorization": f"Bearer {token}"}) as ws:
            await ws.send_json({"kind": "text", "data": "x"})
            assert "seq" in await ws.receive_json(timeout=5)


async def test_output_socket_tells_the_owner_and_its_changes_then_chunks(fence, nc, http):
    token = await register(nc, "b5")
    await ownership.assign(nc, "b5", "e0")
    e0 = await engine(nc, "e0")
    try:
        await e0.adopt("b5", 1)
        async with http.ws_connect(url(fence, "b5", "output"), origin=PAGE) as ws:
            await ws.send_json({"type": "auth", "token": token})
            assert await ws.receive_json(timeout=5) == {"authenticated": True}
            assert await ws.receive_json(timeout=5) == {"owner": {"server_id": "e0", "version": 1, "claimed": True,
                                                                  "closed": False}}
            await ownership.assign(nc, "b5", "e1")
            assert (await ws.receive_json(timeout=5))["owner"] == {"server_id": "e1", "version": 2, "claimed": False,
                                                                   "closed": False}
            chunk = OutputChunk(session_id="b5", block=3, kind="audio", dtype="int16", shape=[1], part=0, parts=1,
                                data=b"\0\0", media_s=0.4, input_seq=2)
            await nc.publish(names.output_subject("b5"), encode(chunk))
            got = decode((await ws.receive(timeout=5)).data, OutputChunk)
            assert (got.block, got.media_s, got.input_seq) == (3, 0.4, 2)
    finally:
        await e0.stop()


async def test_a_slow_viewer_loses_old_chunks_but_never_an_owner_change():
    box = Outbox(max_chunks=2)
    box.chunk(b"1")
    box.text("owner")
    box.chunk(b"2")
    box.chunk(b"3")
    assert [await box.next() for _ in range(3)] == ["owner", b"2", b"3"]
    assert box.chunks == 0
