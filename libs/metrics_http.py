"""`GET /metrics`: the process's `sf_*` metrics in Prometheus' text format, on the service's `metrics_port`.

Every service gets the same small listener (engine hosts, placement and the mover
have no other HTTP server); the numbers come from OpenTelemetry's Prometheus
exporter (`telemetry.setup(prometheus=True)`), so the instruments stay OpenTelemetry's.
"""

from __future__ import annotations

import asyncio
import errno

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest


async def _metrics(_: web.Request) -> web.Response:
    body = await asyncio.to_thread(generate_latest, REGISTRY)  # collection walks every instrument: off the loop
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def start(host: str, port: int, *, log=None) -> tuple[web.AppRunner, int]:
    """Listen on host:port (0: any free port); returns the runner (to clean up) and the port.

    A port another process holds (a second instance on the machine with the same setting) is not
    fatal: the listener takes a free port instead and says so; the caller advertises the port it got."""
    app = web.Application()
    app.router.add_get("/metrics", _metrics, allow_head=False)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except OSError as e:
        if e.errno != errno.EADDRINUSE or port == 0:
            await runner.cleanup()
            raise
        await web.TCPSite(runner, host, 0).start()
        if log is not None:
            log.warning("metrics_port_taken", wanted=port, port=runner.addresses[0][1])
    return runner, runner.addresses[0][1]
