"""Egress: the session's output chunks reach its frontend over a WebSocket, for its token only."""

from __future__ import annotations

import asyncio

import aiohttp

from libs import names
from libs.schemas.base import decode, encode
from libs.schemas.engine import OutputChunk
from tests.support.fence import register


def chunk(block: int) -> OutputChunk:
    return OutputChunk(session_id="s1", block=block, kind="frames", dtype="uint8", shape=[1, 2], part=0, parts=1,
                       data=bytes([block, block]))


async def test_output_chunks_are_forwarded_in_order(fence, nc, http):
    token = await register(nc, "s1")
    url = f"http://127.0.0.1:{fence.http_port}/v1/sessions/s1/output"
    async with http.ws_connect(url, headers={"Authorization": f"Bearer {token}"}) as ws:
        await asyncio.sleep(0.1)  # the subscription is live once the handshake is done; let it settle
        for block in range(1, 6):
            await nc.publish(names.output_subject("s1"), encode(chunk(block)))
        got = [decode((await ws.receive(timeout=5)).data, OutputChunk) for _ in range(5)]
    assert [c.block for c in got] == [1, 2, 3, 4, 5] and got[2].data == bytes([3, 3])


async def test_output_needs_the_sessions_token(fence, nc, http):
    await register(nc, "s1")
    url = f"http://127.0.0.1:{fence.http_port}/v1/sessions/s1/output"
    for headers in ({"Authorization": "Bearer nope"}, {"Authorization": "Basic nope"}):  # no header: see libs/ws_auth
        try:
            async with http.ws_connect(url, headers=headers):
                raise AssertionError("connected without the token")
        except aiohttp.WSServerHandshakeError as e:
            assert e.status == 401


async def test_a_sessions_notice_reaches_its_viewer_as_a_typed_text_frame(fence, nc, http):
    """Overload relief's `SessionNotice` (fence publishes it as it marks the summary) goes to the session's
    viewers as `{"notice": {...}}`, beside the owner messages; another session's does not."""
    import json

    from libs.schemas.common import SessionNotice

    token = await register(nc, "s1")
    url = f"http://127.0.0.1:{fence.http_port}/v1/sessions/s1/output"
    async with http.ws_connect(url, headers={"Authorization": f"Bearer {token}"}) as ws:
        await asyncio.sleep(0.1)  # the subscription is live once the handshake is done; let it settle
        for sid in ("s2", "s1"):
            await nc.publish(names.notice_subject(sid), encode(SessionNotice(
                session_id=sid, kind="capacity_lost", reason="e0's device measured past its limit", at=1.0)))
        while "notice" not in (body := json.loads((await ws.receive(timeout=5)).data)):
            pass
    assert body["notice"] == {"v": 1, "session_id": "s1", "kind": "capacity_lost",
                              "reason": "e0's device measured past its limit", "at": 1.0}
