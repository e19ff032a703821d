"""Failover and faults: a killed server's sessions resume on a replacement (from shared metadata plus
released-but-unapplied and pending input, never contacting the dead server) with no item lost or
applied twice; a NATS restart loses no accepted item."""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp

from libs import bus
from libs.fence import ownership
from services.fence.input_reads import read_items
from tests.support.fence import engine, post, register, start_fence
from tests.support.invariants import check_log, read_log
from tests.support.waiting import eventually

SESSIONS = ("f0", "f1", "f2")


async def crash(eng, conn) -> None:
    """As a dead host: its tasks stop mid-stream and its connection drops without goodbyes."""
    for task in eng.tasks:
        task.cancel()
    await asyncio.gather(*eng.tasks, return_exceptions=True)
    await conn.close()


async def test_killed_server_sessions_resume_on_replacement(fence, nats_server, nc, http):
    js = nc.jetstream()
    conn_a = await bus.connect(nats_server.url, name="a")
    conn_b = await bus.connect(nats_server.url, name="b")
    checkpoints: dict = {}
    a, b = await engine(conn_a, "A", checkpoints, checkpoint_every=5), await engine(conn_b, "B", checkpoints)
    tokens = {sid: await register(nc, sid) for sid in SESSIONS}
    versions = {}
    for sid in SESSIONS:
        versions[sid] = (await ownership.assign(nc, sid, "A")).version
        await a.adopt(sid, versions[sid])

    async def send(n: int) -> None:
        for _ in range(n):
            for sid in SESSIONS:
                status, _ = await post(http, fence, sid, tokens[sid], {"kind": "action", "data": {"k": 1}})
                assert status == 200

    await send(12)
    await eventually(lambda: all(a.state[sid] == list(range(1, 13)) for sid in SESSIONS))
    await crash(a, conn_a)
    await send(3)  # released to the dead owner (it still holds the claim): released but never applied
    for sid in SESSIONS:  # placement's failover: reassign only if A still holds the version it saw
        await wait_for_released(js, sid, 15)
        meta = await b.client.meta(sid)
        assert meta.checkpoint_cursor == 10
        new = await ownership.assign(nc, sid, "B", expect_version=versions[sid])
        lease = await b.adopt(sid, new.version)
        assert lease.cursor == 10
    await send(5)
    await eventually(lambda: all(b.state.get(sid) == list(range(1, 21)) for sid in SESSIONS))
    for sid in SESSIONS:
        released = check_log(await read_log(js, sid))
        to_a = next(v for k, v in released.items() if k.server_id == "A")
        to_b = next(v for k, v in released.items() if k.server_id == "B")
        assert to_a == list(range(1, 16)) and to_b == list(range(11, 21))  # 11..15 re-released once to B
    await b.stop()
    await conn_b.close()


async def wait_for_released(js, sid: str, n: int) -> None:
    for _ in range(500):
        if (await ownership.read_owner(js, sid)).view.released >= n:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"{sid} never released {n}")


async def test_nats_restart_loses_no_accepted_item(fence, nats_server, nc):
    js = nc.jetstream()
    eng = await engine(nc, "E")
    token = await register(nc, "n0")
    a = await ownership.assign(nc, "n0", "E")
    await eng.adopt("n0", a.version)
    acked: list[int] = []
    stop = asyncio.Event()

    async def producer() -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as http:
            while not stop.is_set():
                with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
                    status, body = await post(http, fence, "n0", token, {"kind": "text", "data": "x"})
                    if status == 200:
                        acked.append(body["seq"])
                await asyncio.sleep(0.01)

    task = asyncio.create_task(producer())
    await eventually(lambda: len(acked) >= 20)
    nats_server.kill()
    await asyncio.sleep(0.5)
    nats_server.restart()
    n = len(acked)
    await eventually(lambda: len(acked) >= n + 20, 30)
    stop.set()
    await task
    stored = [i.seq for i, _ in await read_items(js, "n0", 0, 0, max_items=100_000, max_bytes=1 << 30)]
    assert stored == list(range(1, len(stored) + 1)) and set(acked) <= set(stored)
    await eventually(lambda: eng.state["n0"] == stored, 30)
    check_log(await read_log(js, "n0"))
    await eng.stop()


async def test_a_stopped_gateway_instance_loses_nothing(nats_server, nc, http):
    """Two fence instances share the work; one stops mid-stream and the other carries on."""
    fences = [await start_fence(nats_server.url, f"fence-{i}") for i in range(2)]
    eng = await engine(nc, "E")
    tokens = {sid: await register(nc, sid) for sid in SESSIONS}
    for sid in SESSIONS:
        await eng.adopt(sid, (await ownership.assign(nc, sid, "E")).version)
    for i in range(40):
        if i == 20:
            await fences[0].stop()
        for sid in SESSIONS:
            status, _ = await post(http, fences[1] if i >= 20 else fences[i % 2], sid, tokens[sid],
                                   {"kind": "text", "data": str(i)})
            assert status == 200
    await eventually(lambda: all(eng.state[sid] == list(range(1, 41)) for sid in SESSIONS), 20)
    await eng.stop()
    # A stop ends its gateway's fetch loop even when nats-py loses a cancellation (it took 20-40 s then)
    async with asyncio.timeout(10):
        await fences[1].stop()
