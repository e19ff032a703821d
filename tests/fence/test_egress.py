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
