"""Admission and placement for real on the per-test nats-server, tests playing the engine hosts (issue 22: shared
from here, not from tests/admission/conftest.py or a test module): the services' fixtures, heartbeats written as
engine hosts write them, and the API's request bodies and answers."""

from __future__ import annotations

import time

import msgspec
import nats.js.errors
import pytest

from libs import bus, names
from libs.schemas.admission import CreateSession, SessionRecord
from libs.schemas.base import decode, encode
from libs.schemas.common import EngineEntry
from services.admission.service import AdmissionConfig, AdmissionService
from services.placement.service import PlacementConfig, PlacementService
from tests.support.fleet_rows import host
from tests.support.waiting import eventually

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


PROBLEM = "application/problem+json"


def body(**contract) -> dict:
    c = {"session_class": "C1", "quality_floor": 4, "determinism": "T1", "period_ms": 100.0, **contract}
    return {"contract": c, "backend": "world", "seed": 7, "prompt": "a quiet harbour"}


async def problem(resp, status: int) -> dict:
    assert resp.status == status, await resp.text()
    assert resp.content_type == PROBLEM
    p = await resp.json()
    assert p["status"] == status and p["detail"] and "Traceback" not in p["detail"]
    return p


async def records(admission) -> dict[str, SessionRecord]:
    try:
        keys = await admission.records.keys()
    except nats.js.errors.NoKeysError:
        return {}
    return {k: decode((await admission.records.get(k)).value, SessionRecord) for k in keys}


def create_body(**contract) -> CreateSession:
    return msgspec.convert(body(**contract), type=CreateSession)


async def sees(admission, hosts: int = 1) -> None:
    """Wait until admission's engine watch has delivered `hosts` live hosts."""
    async def seen():
        return len(admission.fleet_view().hosts) == hosts
    await eventually(seen)
