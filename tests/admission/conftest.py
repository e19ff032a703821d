"""Admission and placement running for real on a per-test nats-server; tests play the engine hosts."""

from __future__ import annotations

import time

import aiohttp
import pytest

from libs import bus, names
from libs.schemas.base import encode
from libs.schemas.common import EngineEntry
from services.admission.service import AdmissionConfig, AdmissionService
from services.placement.service import PlacementConfig, PlacementService
from tests.admission.fleet import host

ADMIN_TOKEN = "test-admin-token"


class Fleet:
    """Writes engine heartbeats into `sf_engines` as engine hosts do."""

    def __init__(self, kv) -> None:
        self.kv = kv

    async def beat(self, host_id: str = "h0", **kw) -> EngineEntry:
        entry = host(host_id, at=time.time(), **kw)
        await self.kv.put(host_id, encode(entry))
        return entry


@pytest.fixture
async def fleet(nc):
    return Fleet(await bus.ensure_kv(nc.jetstream(), names.ENGINES_BUCKET, ttl_s=6.0))


def admission_config(url: str, **kw) -> AdmissionConfig:
    base = dict(nats_url=url, http_port=0, admin_token=ADMIN_TOKEN, queue_capacity=2, queue_timeout_s=20.0,
                reservation_settle_s=60.0, heartbeat_s=2.0, place_timeout_s=1.0, log_json=False)
    return AdmissionConfig(**{**base, **kw})


@pytest.fixture
async def placement(nats_server):
    svc = PlacementService(PlacementConfig(nats_url=nats_server.url, reservation_settle_s=60.0))
    await svc.start()
    yield svc
    await svc.stop()


@pytest.fixture
async def start_admission(nats_server, fence):
    started: list[AdmissionService] = []

    async def start(**kw) -> AdmissionService:
        svc = AdmissionService(admission_config(nats_server.url, **kw))
        await svc.start()
        started.append(svc)
        return svc

    yield start
    for svc in started:
        if not svc.nc.is_closed:
            await svc.stop()


@pytest.fixture
async def admission(start_admission, placement, fleet):
    return await start_admission()


@pytest.fixture
async def http(admission):
    # the admin's credential on every request, as `statefleet session` sends it; tests of the
    # credential itself pass their own header
    async with aiohttp.ClientSession(f"http://127.0.0.1:{admission.http_port}",
                                     headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as session:
        yield session
