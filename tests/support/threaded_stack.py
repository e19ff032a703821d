"""Fence (where asked), placement and admission on a private event loop in a daemon thread, with engine
heartbeats written as engine hosts write them, for test drivers that are synchronous (hypothesis state
machines, schemathesis): they call `run` or plain HTTP from the test's thread (issue 22: one builder for
both). No engine host runs: a test plays one where it needs a consumer."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

from libs import bus, names
from libs.natsd import NatsServer
from libs.schemas.base import encode
from services.admission.service import AdmissionConfig, AdmissionService
from services.fence.service import FenceConfig, FenceService
from services.placement.service import PlacementConfig, PlacementService
from tests.support.fleet_rows import host


class ThreadedStack:
    """`stop` undoes the start in reverse. `busy`: the engine hosts to beat for, each with its load;
    `fence`: FenceConfig settings, or None for no fence."""

    def __init__(self, store_dir, *, admission: Callable[[str], AdmissionConfig], busy: dict[str, float],
                 fence: dict | None = None) -> None:
        self.admission_config, self.busy, self.fence_settings = admission, busy, fence
        self.server = NatsServer(store_dir=store_dir).start()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.run(self._start())

    def run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=60)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.admission.http_port}"

    async def _start(self) -> None:
        url = self.server.url
        self.services: list = []
        if self.fence_settings is not None:
            self.fence = await self._service(FenceService(FenceConfig(nats_url=url, **self.fence_settings)))
        self.placement = await self._service(PlacementService(PlacementConfig(nats_url=url)))
        self.admission = await self._service(AdmissionService(self.admission_config(url)))
        self.nc = await bus.connect(url, name="engines")
        self.engines = await bus.ensure_kv(self.nc.jetstream(), names.ENGINES_BUCKET, ttl_s=6.0)
        self.beating = asyncio.create_task(self._beat())

    async def _service(self, svc):
        await svc.start()
        self.services.append(svc)
        return svc

    async def _beat(self) -> None:
        while True:
            for h, busy in self.busy.items():
                await self.engines.put(h, encode(host(h, busy=busy, at=time.time())))
            await asyncio.sleep(0.5)

    async def _stop(self) -> None:
        self.beating.cancel()
        await asyncio.gather(self.beating, return_exceptions=True)
        await self.nc.close()
        for svc in reversed(self.services):
            await svc.stop()

    def stop(self) -> None:
        self.run(self._stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()
        self.server.stop()
