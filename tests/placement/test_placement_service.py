"""The placement service on a real nats-server: `sf.placement.place` over the bus."""

from __future__ import annotations

import asyncio
import time

import msgspec
import pytest

from libs import bus, names
from libs.contracts import Guard
from libs.errors import Rejected, SchemaError
from libs.schemas.base import encode
from libs.schemas.common import Ping
from libs.schemas.placement import Placement, PlaceRequest
from services.placement.service import PlacementConfig, PlacementService
from tests.support.admission import placement  # noqa: F401  (the service, started on the test's server)
from tests.support.fleet_rows import c1, host
from tests.support.waiting import eventually


def req(sid: str = "s1") -> PlaceRequest:
    return PlaceRequest(session_id=sid, backend="world", contract=c1(), guard=Guard(max_sessions=8))


pytestmark = pytest.mark.usefixtures("placement")


async def beat(nc, *entries):
    kv = await bus.ensure_kv(nc.jetstream(), names.ENGINES_BUCKET, ttl_s=6.0)
    for e in entries:
        await kv.put(e.host_id, encode(e))


async def test_place_answers_the_least_busy_fitting_host(nc, placement):  # noqa: F811
    await beat(nc, host("h0", busy=0.85, at=time.time()), host("h1", at=time.time()))
    deadline = time.monotonic() + 10  # its watch delivers the beats a moment later (seconds, on a loaded machine)
    while set(placement.liveness.live) != {"h0", "h1"}:
        assert time.monotonic() < deadline, "placement never heard the hosts"
        await asyncio.sleep(0.02)
    p = await bus.request(nc, names.PLACEMENT_PLACE, req("s1"), Placement)
    assert p.host_id == "h1" and p.estimate.fits
    assert await bus.request(nc, names.PLACEMENT_PLACE, req("s1"), Placement) == p  # a retry: same host


async def test_no_fit_and_silent_hosts_are_a_typed_reject(nc):
    # h1 declares a 50 ms heartbeat and then stays silent: three missed beats and it is dead.
    await beat(nc, host("h0", busy=0.85, at=time.time()),
               msgspec.structs.replace(host("h1", at=time.time()), heartbeat_s=0.05))
    await asyncio.sleep(0.3)
    with pytest.raises(Rejected) as e:
        await bus.request(nc, names.PLACEMENT_PLACE, req("s1"), Placement)
    assert e.value.reason == "no_fit" and e.value.hosts == "h0:busy"


async def test_a_malformed_request_is_a_schema_error(nc):
    with pytest.raises(SchemaError):
        await bus.request(nc, names.PLACEMENT_PLACE, Ping(), Placement)


async def test_an_undecodable_heartbeat_is_skipped_not_fatal(nc, placement):  # noqa: F811
    kv = await bus.ensure_kv(nc.jetstream(), names.ENGINES_BUCKET, ttl_s=6.0)
    await kv.put("garbage", b"\x00\x01not msgpack")
    await beat(nc, host("h0", at=time.time()))
    deadline = time.monotonic() + 10  # the watch goes on past the garbage and delivers h0 a moment later
    while "h0" not in placement.liveness.live:
        assert time.monotonic() < deadline, "placement never heard h0"
        await asyncio.sleep(0.02)
    assert (await bus.request(nc, names.PLACEMENT_PLACE, req("s1"), Placement)).host_id == "h0"


async def test_two_placers_on_two_hosts_of_one_device_never_both_land(nats_server, nc, placement):  # noqa: F811
    """Invariant: hosts that share a device are judged together, also at the final compare-and-set.
    Two sessions, each needing over half the device, placed at once by two instances on a device's two
    hosts: one lands, the other is refused. (Each host's own CAS alone lets both land.)"""
    other = PlacementService(PlacementConfig(nats_url=nats_server.url, reservation_settle_s=60.0))
    await other.start()
    try:
        pair = [msgspec.structs.replace(host(h, at=time.time()), machine="m1") for h in ("h0", "h1")]
        await beat(nc, *pair)
        await eventually(lambda: len(placement.live_hosts()) == 2 and len(other.live_hosts()) == 2)
        kv = await bus.ensure_kv(nc.jetstream(), names.CAPACITY_BUCKET)
        for round_ in range(4):
            reqs = [PlaceRequest(session_id=f"r{round_}{x}", backend="world", contract=c1(period_ms=20.0),
                                 guard=Guard(max_sessions=8)) for x in "ab"]
            got = await asyncio.gather(placement._on_place(reqs[0]), other._on_place(reqs[1]), return_exceptions=True)
            assert sum(isinstance(g, Placement) for g in got) == 1, got
            assert all(isinstance(g, Placement | Rejected) for g in got), got
            for h in ("h0", "h1"):  # the next round starts from an empty device
                await kv.purge(h)
            await eventually(lambda: not any(r.sessions for r in placement.hosts.values.values())
                             and not any(r.sessions for r in other.hosts.values.values()))
    finally:
        await other.stop()
