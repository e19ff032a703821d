"""Two instances of one service on one machine, configured alike, both serve `/metrics`: a per-instance
offset spreads them, and a port already taken falls back to a free one rather than stopping the
second instance; each instance advertises the port it got in its `sf_services` entry."""

from __future__ import annotations

import aiohttp

from libs import names
from libs.natsd import free_port
from libs.schemas.base import decode
from libs.schemas.common import ServiceEntry
from services.placement.service import PlacementConfig, PlacementService


async def _scrape(port: int) -> str:
    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://127.0.0.1:{port}/metrics") as resp:
            assert resp.status == 200
            return await resp.text()


async def _advertised(nc, service: PlacementService) -> int:
    kv = await nc.jetstream().key_value(names.SERVICES_BUCKET)
    return decode((await kv.get(f"placement.{service.instance}")).value, ServiceEntry).metrics_port


async def test_two_instances_with_one_metrics_port_both_serve_metrics(nats_server, nc):
    port = free_port()
    started = []
    try:
        for i, offset in enumerate((0, 0, 1)):  # two alike, and a third with its own offset
            svc = PlacementService(PlacementConfig(nats_url=nats_server.url_for("placement"), log_json=False,
                                                   instance_id=f"placement-{i}", metrics_port=port,
                                                   metrics_port_offset=offset))
            await svc.start()
            started.append(svc)
        ports = [s.metrics_port for s in started]
        assert ports[0] == port and len(set(ports)) == 3, ports
        assert ports[2] == port + 1  # the offset one got its own port, not a fallback
        for svc in started:
            assert "# HELP" in await _scrape(svc.metrics_port)
            assert await _advertised(nc, svc) == svc.metrics_port
    finally:
        for svc in started:
            await svc.stop()
