"""Ownership races through a real nats-server: two fence instances (ingress + gateway), three engine
servers, two controllers reassigning at random, late and duplicate claims. Every incarnation must see
exactly the releases addressed to it, in order; the final owner's state holds every accepted item once."""

from __future__ import annotations

import asyncio
import contextlib
import random

import pytest

from libs import bus, errors
from libs.fence import ownership
from tests.support.fence import engine, post, register, start_fence
from tests.support.invariants import check_log, read_log
from tests.support.waiting import eventually

SESSIONS = ("r0", "r1", "r2")
SERVERS = ("e0", "e1", "e2")
ITEMS = 80


async def adopt_loop(eng, rng: random.Random, leases: list) -> None:
    async for notice in eng.client.assignments():
        async def adopt(n=notice):
            await asyncio.sleep(rng.uniform(0, 0.05))  # late claims
            with contextlib.suppress(errors.Conflict):
                leases.append(await eng.adopt(n.session_id, n.version))
                if rng.random() < 0.3:  # a duplicate claim must be refused
                    with pytest.raises(errors.Conflict):
                        await eng.client.claim(n.session_id, n.version, 0)
        eng.tasks.append(asyncio.create_task(adopt()))


async def controller(nc, rng: random.Random, stop: asyncio.Event) -> None:
    js = nc.jetstream()
    while not stop.is_set():
        sid = rng.choice(SESSIONS)
        seen = await ownership.read_owner(js, sid)  # a stale view by the time it is used
        await asyncio.sleep(rng.uniform(0, 0.03))
        with contextlib.suppress(errors.Conflict):
            await ownership.assign(nc, sid, rng.choice(SERVERS),
                                   expect_version=seen.view.owner.version if seen.view.owner else 0)
        await asyncio.sleep(rng.uniform(0.05, 0.15))


@pytest.mark.parametrize("seed", [7, 8])
async def test_two_gateways_with_concurrent_reassignment(nats_server, http, seed):
    rng = random.Random(seed)
    fences = [await start_fence(nats_server.url, f"fence-{i}") for i in range(2)]
    conns = [await bus.connect(nats_server.url, name=f"c{i}") for i in range(len(SERVERS) + 1)]
    nc = conns[-1]
    checkpoints: dict = {}
    engines = [await engine(c, s, checkpoints, checkpoint_every=7) for c, s in zip(conns, SERVERS, strict=False)]
    leases: list = []
    loops = [asyncio.create_task(adopt_loop(e, rng, leases)) for e in engines]
    tokens = {sid: await register(nc, sid) for sid in SESSIONS}
    for sid in SESSIONS:
        await ownership.assign(nc, sid, rng.choice(SERVERS))
    stop = asyncio.Event()
    controllers = [asyncio.create_task(controller(nc, random.Random(seed * 10 + i), stop)) for i in range(2)]
    try:
        for i in range(ITEMS):
            for sid in SESSIONS:
                status, body = await post(http, fences[i % 2], sid, tokens[sid], {"kind": "text", "data": str(i)})
                assert status == 200 and body["seq"] == i + 1, body
            await asyncio.sleep(0.005)
        stop.set()
        await asyncio.gather(*controllers)
        final = {}
        for sid in SESSIONS:  # one last assign; its owner must end with every item exactly once
            a = await ownership.assign(nc, sid, "e0")
            final[sid] = a.version
        await eventually(lambda: all(any(le.owner.server_id == "e0" and le.owner.version == final[le.session_id]
                                           for le in leases if le.session_id == sid) for sid in SESSIONS), 20)
        e0 = engines[0]
        await eventually(lambda: all(e0.state.get(sid) == list(range(1, ITEMS + 1)) for sid in SESSIONS), 20)
        for sid in SESSIONS:
            records = await read_log(nc.jetstream(), sid)
            released = check_log(records)
            versions = sum(1 for r in records if type(r.event).__name__ == "Assign")
            assert versions >= 2
            for lease in (le for le in leases if le.session_id == sid):
                got = released.get(lease.owner, [])
                assert got == list(range(lease.cursor + 1, lease.cursor + 1 + len(got)))
        assert sum(f.gateway.tails != {} for f in fences) == 2  # both gateways took part
        # Revoked leases let go of their consumers; each engine keeps only the leases it still holds.
        await eventually(lambda: all(e.client.lease(sid) is None or not e.client.lease(sid).revoked.is_set()
                                   for e in engines for sid in SESSIONS))
        assert [e.client.lease(sid) is not None for e in engines for sid in SESSIONS] == [True] * 3 + [False] * 6
    finally:
        stop.set()
        for t in loops:
            t.cancel()
        for e in engines:
            await e.stop()
        for f in fences:
            await f.stop()
        for c in conns:
            await c.close()
