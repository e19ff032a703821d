"""A bus outage is not the fleet dying: the nats-server is stopped for longer than the engines' heartbeat
TTL (so their entries expire) and started again on the same port and store. The engine hosts come
back on their own reconnect schedule, a little after placement does. Placement declares none of
them dead; and the grace is not blindness: a host that stays silent after the outage is still
declared dead once the grace is over."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest

from libs import bus, names
from libs.schemas.base import encode
from services.placement.service import PlacementConfig, PlacementService
from tests.support.fleet_rows import host

HEARTBEAT_S = 0.5
GRACE_S = 4.0
OUTAGE_S = names.ENGINES_TTL_S + 0.5  # every heartbeat entry expires while the bus is down
LATE_S = 2.0  # the hosts' first beat after the restart comes this long after the server is back


class Engine:
    """An engine host's heartbeat, over its own connection as its own NATS user."""

    def __init__(self, server, host_id: str) -> None:
        self.server, self.host_id = server, host_id
        self.paused_until = 0.0
        self.stopped = False

    async def run(self) -> None:
        nc = await bus.connect(self.server.url_for("engine_host", self.host_id), name=self.host_id)
        kv = await bus.ensure_kv(nc.jetstream(), names.ENGINES_BUCKET, ttl_s=names.ENGINES_TTL_S)
        try:
            while not self.stopped:
                if time.monotonic() >= self.paused_until:
                    entry = host(self.host_id, at=time.time())
                    entry.heartbeat_s = HEARTBEAT_S
                    with contextlib.suppress(Exception):  # the bus is away: beat again next time
                        await kv.put(self.host_id, encode(entry))
                await asyncio.sleep(HEARTBEAT_S)
        finally:
            await nc.close()


@pytest.mark.slow
async def test_placement_declares_no_host_dead_across_a_bus_outage(nats_server):
    engines = [Engine(nats_server, h) for h in ("e0", "e1")]
    tasks = [asyncio.create_task(e.run()) for e in engines]
    placement = PlacementService(PlacementConfig(nats_url=nats_server.url_for("placement"), log_json=False,
                                                 heartbeat_s=HEARTBEAT_S, bus_reconnect_grace_s=GRACE_S))
    await placement.start()
    try:
        deadline = time.monotonic() + 10
        while set(placement.liveness.live) != {"e0", "e1"}:
            assert time.monotonic() < deadline, "placement never saw both hosts"
            await asyncio.sleep(0.1)

        nats_server.stop()
        await asyncio.sleep(OUTAGE_S)
        for e in engines:
            e.paused_until = time.monotonic() + LATE_S
        await asyncio.to_thread(nats_server.start)
        engines[1].stopped = True  # e1 never comes back: it died during the outage

        watch_until = time.monotonic() + LATE_S + 2.0
        while time.monotonic() < watch_until:  # through the hosts' late return and beyond
            assert "e0" in placement.liveness.live, "a live host was declared dead by the outage"
            assert not placement.liveness.dead.get("e0")
            await asyncio.sleep(0.05)
        deadline = time.monotonic() + GRACE_S + 5.0
        while "e1" in placement.liveness.live:  # the silent one dies once the grace is over
            assert time.monotonic() < deadline, "a host silent after the outage was never declared dead"
            await asyncio.sleep(0.1)
        assert "e0" in placement.liveness.live and not placement.liveness.dead.get("e0")
    finally:
        for e in engines:
            e.stopped = True
        await asyncio.gather(*tasks, return_exceptions=True)
        await placement.stop()
