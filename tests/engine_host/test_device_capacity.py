"""Hosts that share a device measure its capacity once, together, and report it once."""

from __future__ import annotations

import asyncio

from libs import bus, names
from libs import capacity_model as cm
from libs.schemas.base import decode
from libs.schemas.capacity import DeviceCapacity
from libs.schemas.common import EngineEntry
from services.engine_host.device_capacity import device_kv_key
from services.engine_host.service import EngineHostConfig, EngineHostService


def config(url: str, host_id: str, tmp_path) -> EngineHostConfig:
    return EngineHostConfig(nats_url=url, host_id=host_id, heartbeat_s=0.5, profile_blocks=1, max_sessions=8,
                            capacity_probe_budget_s=6.0, checkpoint_dir=str(tmp_path / "ckpt"), device_hosts=2)


async def entries(nc, *host_ids: str) -> dict[str, EngineEntry]:
    kv = await nc.jetstream().key_value(names.ENGINES_BUCKET)
    while True:
        got = {}
        for h in host_ids:
            e = decode((await kv.get(h)).value, EngineEntry)
            if e.capacity is not None:
                got[h] = e
        if len(got) == len(host_ids):
            return got
        await asyncio.sleep(0.1)


async def test_two_hosts_on_one_device_measure_it_once_and_report_it_once(nats_server, nc, tmp_path):
    hosts = [EngineHostService(config(nats_server.url, h, tmp_path)) for h in ("h1", "h2")]
    await asyncio.gather(*(h.start() for h in hosts))
    try:
        assert sorted(h.keeper.measured_here for h in hosts) == [False, True]  # one measured, one adopted
        got = await entries(nc, "h1", "h2")
        device = {cm_key for cm_key in (e.capacity.device for e in got.values())}
        assert len(device) == 1
        kv = await bus.ensure_kv(nc.jetstream(), names.DEVICE_CAPACITY_BUCKET)
        rec = decode((await kv.get(device_kv_key(device.pop()))).value, DeviceCapacity)
        assert rec.state == "measured" and rec.hosts == ["h1", "h2"]
        measurer = next(h.host_id for h in hosts if h.keeper.measured_here)
        assert {e.capacity.measured_by for e in got.values()} == {measurer}
        # the adopter's profile is the measurer's: the same rows, not a second measurement beside it
        assert got["h1"].profile == got["h2"].profile
        for c in rec.curves:  # every tier of every backend, at 1, 2, 4, … co-located sessions
            assert [p.sessions for p in c.points][:1] == [1] and all(p.chunk_ms > 0 for p in c.points)
            assert [p.sessions for p in c.points] == sorted({p.sessions for p in c.points})
        assert {(c.backend, c.tier) for c in rec.curves} == {(r.backend, r.tier) for r in rec.rows}
        assert cm.curve_for(rec, "world", 1) is not None
    finally:
        await asyncio.gather(*(h.stop() for h in hosts))
