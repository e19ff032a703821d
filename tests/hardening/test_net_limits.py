"""Connection, slow-client and idle limits on fence's ingress (the same guard fronts admission's API).

Each limit is exercised by the client it exists for, against a real fence on a real nats-server:
a slowloris head, a body that never finishes, an idle connection, one connection too many, an
input socket that never speaks, a socket too many, and a viewer that never reads. Each refusal is
typed (408/503 problem+json, WebSocket close 4408; a reader that never reads is dropped) and counted in `/metrics`; a normal client
on the same server is served throughout.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import socket
import time

import aiohttp
import pytest

from libs import names
from libs.ws_limits import CLOSE_IDLE
from tests.support.fence import register, start_fence
from tests.support.metrics import refused

SID = "a" * 32
TIGHT = dict(http_head_timeout_s=0.5, http_body_timeout_s=0.5, http_idle_timeout_s=0.8, http_max_connections=3,
             ws_max_sockets=2, ws_idle_timeout_s=0.5, ws_send_timeout_s=0.5, metrics_port=0)


@pytest.fixture
async def fence(nats_server):
    service = await start_fence(nats_server.url_for("fence"), "fence-limits", **TIGHT)
    yield service
    await service.stop()


async def read_all(reader: asyncio.StreamReader, timeout_s: float) -> bytes:
    """Everything the server sends until it closes the connection (fails if it never does)."""
    return await asyncio.wait_for(reader.read(), timeout_s)


async def test_a_slowloris_head_is_cut_off_with_408(fence):
    before = await refused(fence, "sf_http_refused_total", "head_timeout")
    reader, writer = await asyncio.open_connection("127.0.0.1", fence.http_port)
    start = time.monotonic()

    async def trickle() -> None:
        writer.write(f"POST /v1/sessions/{SID}/items HTTP/1.1\r\nHost: x\r\n".encode())
        with contextlib.suppress(ConnectionError):
            for _ in range(100):  # a header byte every 50 ms: each alone would beat any per-read timeout
                writer.write(b"X")
                await writer.drain()
                await asyncio.sleep(0.05)

    sending = asyncio.create_task(trickle())
    answer = await read_all(reader, 5.0)
    sending.cancel()
    writer.close()
    assert answer.startswith(b"HTTP/1.1 408") and b"application/problem+json" in answer, answer[:200]
    assert b'"code": "request_timeout"' in answer
    assert time.monotonic() - start < 2.0
    assert await refused(fence, "sf_http_refused_total", "head_timeout") == before + 1


async def test_a_body_that_never_finishes_is_cut_off_with_408(fence):
    before = await refused(fence, "sf_http_refused_total", "body_timeout")
    reader, writer = await asyncio.open_connection("127.0.0.1", fence.http_port)
    writer.write(f"POST /v1/sessions/{SID}/items HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 f"Content-Length: 100\r\n\r\n{{\"kind\"".encode())
    answer = await read_all(reader, 5.0)
    writer.close()
    assert answer.startswith(b"HTTP/1.1 408") and b"problem+json" in answer, answer[:200]
    assert await refused(fence, "sf_http_refused_total", "body_timeout") == before + 1


async def test_idle_connections_are_closed_and_busy_ones_are_not(fence):
    before = await refused(fence, "sf_http_refused_total", "idle")
    reader, writer = await asyncio.open_connection("127.0.0.1", fence.http_port)  # says nothing
    assert await read_all(reader, 3.0) == b""
    writer.close()
    async with aiohttp.ClientSession() as http:  # a keep-alive connection, idle after its request
        async with http.get(f"http://127.0.0.1:{fence.http_port}/healthz") as resp:
            assert resp.status == 200
        await asyncio.sleep(1.5)
        async with http.get(f"http://127.0.0.1:{fence.http_port}/healthz") as resp:
            assert resp.status == 200  # the client notices the closed connection and opens a new one
    assert await refused(fence, "sf_http_refused_total", "idle") >= before + 2


async def test_one_connection_too_many_is_answered_503_with_retry_after(fence):
    before = await refused(fence, "sf_http_refused_total", "connections")
    held = [await asyncio.open_connection("127.0.0.1", fence.http_port) for _ in range(3)]
    reader, writer = await asyncio.open_connection("127.0.0.1", fence.http_port)
    answer = await read_all(reader, 3.0)
    writer.close()
    assert answer.startswith(b"HTTP/1.1 503") and b"Retry-After: 1" in answer, answer[:300]
    assert b'"code": "too_many_connections"' in answer
    for _, w in held:
        w.close()
    await asyncio.sleep(0.1)
    async with aiohttp.ClientSession() as http:  # room again once they went
        async with http.get(f"http://127.0.0.1:{fence.http_port}/healthz") as resp:
            assert resp.status == 200
    assert await refused(fence, "sf_http_refused_total", "connections") == before + 1


async def test_an_idle_input_socket_is_closed_4408(fence, nc):
    token = await register(nc, SID)
    before = await refused(fence, "sf_ws_refused_total", "idle")
    url = f"http://127.0.0.1:{fence.http_port}/v1/sessions/{SID}/ws"
    async with aiohttp.ClientSession() as http:
        async with http.ws_connect(url, headers={"Authorization": f"Bearer {token}"}) as ws:
            await ws.send_json({"kind": "text", "data": "hello"})  # speaking keeps it open
            assert "seq" in await ws.receive_json(timeout=5)
            msg = await ws.receive(timeout=5)  # then silence
            assert msg.type == aiohttp.WSMsgType.CLOSE and msg.data == CLOSE_IDLE, msg
            assert b"idle" in (msg.extra or "").encode()
    assert await refused(fence, "sf_ws_refused_total", "idle") == before + 1


async def test_a_socket_too_many_is_refused_503_before_the_upgrade(fence, nc):
    token = await register(nc, SID)
    before = await refused(fence, "sf_ws_refused_total", "sockets")
    auth = {"Authorization": f"Bearer {token}"}
    url = f"http://127.0.0.1:{fence.http_port}/v1/sessions/{SID}/output"
    async with aiohttp.ClientSession() as http:
        async with http.ws_connect(url, headers=auth), http.ws_connect(url, headers=auth):
            with pytest.raises(aiohttp.WSServerHandshakeError) as refusal:
                async with http.ws_connect(url, headers=auth):
                    pass
            assert refusal.value.status == 503 and refusal.value.headers["Retry-After"] == "1"
        await asyncio.sleep(0.2)
        async with http.ws_connect(url, headers=auth):  # a slot is free again once they closed
            pass
    assert await refused(fence, "sf_ws_refused_total", "sockets") == before + 1


async def test_a_viewer_that_never_reads_is_dropped_not_waited_for(fence, nc):
    """A raw WebSocket client that completes the handshake and then never reads: once the socket's
    buffers are full, the send times out, the connection is dropped and its slot freed."""
    token = await register(nc, SID)
    before = await refused(fence, "sf_ws_refused_total", "slow_reader")
    loop = asyncio.get_running_loop()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await loop.sock_connect(sock, ("127.0.0.1", fence.http_port))
    key = base64.b64encode(os.urandom(16)).decode()
    await loop.sock_sendall(sock, f"GET /v1/sessions/{SID}/output HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
                 f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
                 f"Authorization: Bearer {token}\r\n\r\n".encode())
    assert (await loop.sock_recv(sock, 12)) == b"HTTP/1.1 101"
    try:
        payload = b"\x00" * (256 << 10)
        deadline = time.monotonic() + 15.0
        while await refused(fence, "sf_ws_refused_total", "slow_reader") == before:
            assert time.monotonic() < deadline, "the server kept waiting on a client that does not read"
            for _ in range(8):
                await nc.publish(names.output_subject(SID), payload)
            await asyncio.sleep(0.2)
        deadline = time.monotonic() + 5.0
        while fence.ingress.sockets.open:
            assert time.monotonic() < deadline, "the slot of the dropped socket was never freed"
            await asyncio.sleep(0.05)
    finally:
        sock.close()
