"""Backpressure from a slow engine to the client, on a real fence and nats-server.

Invariants: an owner is never released more than `max_unapplied_items` beyond the applied cursor
it reported (its queue is bounded); once the session's unreleased items reach `max_pending_items`,
ingress answers a typed 429 with Retry-After instead of accepting more; and every item ingress
acknowledged reaches the owner exactly once, in order, once it catches up.
"""

from __future__ import annotations

import asyncio

from libs.fence import ownership, session_log
from libs.fence.client import EngineClient
from tests.support.fence import register, start_fence
from tests.support.waiting import eventually

UNAPPLIED, PENDING = 4, 6


async def _post(http, fence, token: str, text: str) -> tuple[int, dict, dict]:
    url = f"http://127.0.0.1:{fence.http_port}/v1/sessions/bp1/items"
    async with http.post(url, json={"kind": "text", "data": text},
                         headers={"Authorization": f"Bearer {token}"}) as resp:
        return resp.status, await resp.json(content_type=None), dict(resp.headers)


async def test_a_slow_engine_backs_ingress_off_with_429_and_nothing_is_lost(nats_server, nc, http):
    fence = await start_fence(nats_server.url_for("fence"), "fence-bp", max_unapplied_items=UNAPPLIED,
                              max_pending_items=PENDING)
    client = EngineClient(nc, nc.jetstream(), "e1")
    await client.start()
    try:
        token = await register(nc, "bp1")
        a = await ownership.assign(nc, "bp1", "e1")
        lease = await client.claim("bp1", a.version, cursor=0)  # claimed, and taking nothing yet

        acked, refusals = [], []
        for i in range(20):
            status, body, headers = await _post(http, fence, token, f"item {i}")
            if status == 200:  # also after a 429: the gateway releasing items frees pending room
                acked.append(body["seq"])
            else:
                refusals.append((status, body["code"], headers.get("Retry-After"),
                                 headers.get("Content-Type", "").split(";")[0]))
        assert acked == list(range(1, len(acked) + 1)) and PENDING <= len(acked) <= UNAPPLIED + PENDING
        assert set(refusals) == {(429, "busy", "1", "application/problem+json")}

        await eventually(lambda: lease.backlog == UNAPPLIED)
        await asyncio.sleep(0.3)  # and no further: the owner's queue is bounded
        assert lease.backlog == UNAPPLIED
        assert (await session_log.read_tail(nc.jetstream(), "bp1")).view.released == UNAPPLIED

        got: list[int] = []

        async def catch_up() -> None:
            async for item in lease:
                got.append(item.seq)
                if lease.backlog == 0:
                    await lease.report_applied(item.seq)

        consumer = asyncio.create_task(catch_up())
        await eventually(lambda: got == acked, timeout_s=15)
        status, body, _ = await _post(http, fence, token, "after")  # room again
        assert status == 200 and body["seq"] == len(acked) + 1
        await eventually(lambda: got == [*acked, len(acked) + 1])
        consumer.cancel()
    finally:
        await client.close()
        await fence.stop()
