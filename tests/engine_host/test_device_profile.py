"""Hosts that share a device profile it once, measured across their processes (services/engine_host/device_profile.py,\nspread.py), on a real NATS server."""

from __future__ import annotations

import asyncio

import msgspec

from libs import bus, names
from libs.contracts import Guard, carried
from libs.motion import machine
from libs.schemas.base import decode
from libs.schemas.common import EngineEntry, ProfileRow
from services.engine_host import colocated, device_profile
from services.engine_host.costs import shape_of
from services.engine_host.service import EngineHostConfig, EngineHostService
from tests.support.fleet_rows import c1

ROW = ProfileRow(backend="world", tier=1, quantum_ms=1.0, block_ms=2.0, state_bytes=10, media_s_per_block=0.1,
                 colocated=[2.0, 2.5])


async def test_two_hosts_on_one_device_measure_once_and_serve_the_same_rows(nats_server, tmp_path):
    hosts = [EngineHostService(EngineHostConfig(nats_url=nats_server.url_for("engine_host", h), host_id=h,
                                                heartbeat_s=0.5, profile_blocks=1, colocated_sessions=4,
                                                hosts_on_machine=2, checkpoint_dir=str(tmp_path / "ckpt")))
             for h in ("e0", "e1")]
    await asyncio.gather(*(h.start() for h in hosts))  # at once: both reach the device's key together
    try:
        nc = await bus.connect(nats_server.url, name="test")
        kv = await nc.jetstream().key_value(names.ENGINES_BUCKET)
        entries = [decode((await kv.get(h)).value, EngineEntry) for h in ("e0", "e1")]
        profiles = await nc.jetstream().key_value(names.DEVICE_PROFILES_BUCKET)
        published = await bus.kv_entries(profiles)
        await nc.close()
    finally:
        await asyncio.gather(*(h.stop() for h in hosts))
    assert len(published) == 1  # one device, one key: measured by one host
    rows = msgspec.msgpack.decode(published[0].value, type=list[ProfileRow])
    assert hosts[0].profile == hosts[1].profile == rows  # both serve the measuring host's rows
    # and both heartbeats carry them with the co-location curve at 1, 2, 4 sessions
    assert entries[0].machine == entries[1].machine
    assert all(len(r.colocated) == len(colocated.concurrencies(4)) == 3 and min(r.colocated) > 0 for r in rows)
    # the curve was measured with the sessions spread over the device's two host processes (the key says
    # across how many), and the two hosts report the device's capacity once
    shapes = [shape_of(hosts[0].runtime.backend(i.name)) for i in hosts[0].backend_infos]
    assert published[0].key == device_profile.device_profile_key(machine.identity(), "cpu", shapes,
                                                                 entries[0].threads, processes=2)
    one = carried(c1(), "world", entries[:1], Guard())
    assert carried(c1(), "world", entries, Guard()) == one and sum(one.values()) > 0


async def test_a_waiting_host_takes_the_published_rows_and_measures_itself_when_none_come(nc):
    kv = await bus.ensure_kv(nc.jetstream(), names.DEVICE_PROFILES_BUCKET, ttl_s=60)
    measured: list[str] = []

    async def measure() -> list[ProfileRow]:
        measured.append("here")
        return [msgspec.structs.replace(ROW, block_ms=9.0)]

    # the first host claims and measures; a second finds the device's rows and takes them
    rows, by_me = await device_profile.shared_rows(kv, "dev", "e0", measure, wait_s=30, poll_s=0.05)
    assert by_me and measured == ["here"]
    again, by_me = await device_profile.shared_rows(kv, "dev", "e1", measure, wait_s=30, poll_s=0.05)
    assert again == rows and not by_me and measured == ["here"]
    # a claim whose measurer never publishes: the waiter measures itself once its wait is over (and
    # publishes nothing: the claim is not its own)
    assert await bus.kv_swap(kv, "stuck", device_profile.CLAIM + b"e0", 0)
    rows, by_me = await device_profile.shared_rows(kv, "stuck", "e1", measure, wait_s=0.3, poll_s=0.05)
    assert by_me and measured == ["here", "here"]
    assert (await bus.kv_read(kv, "stuck")).value == device_profile.CLAIM + b"e0"
    # the claimer itself, restarted, takes its own claim over at once and publishes
    rows, by_me = await device_profile.shared_rows(kv, "stuck", "e0", measure, wait_s=30, poll_s=0.05)
    assert by_me and measured == ["here"] * 3
    assert msgspec.msgpack.decode((await bus.kv_read(kv, "stuck")).value, type=list[ProfileRow]) == rows


def test_device_profile_key_names_what_the_rows_depend_on():
    key = device_profile.device_profile_key("boot/host", "cpu", ["world:1", "dit:2"], 1)
    assert key == device_profile.device_profile_key("boot/host", "cpu", ["dit:2", "world:1"], 1)
    assert key != device_profile.device_profile_key("boot/host", "cpu", ["dit:2", "world:1"], 2)
    assert key != device_profile.device_profile_key("boot/host", "cuda:0", ["dit:2", "world:1"], 1)
    assert key.isalnum()
