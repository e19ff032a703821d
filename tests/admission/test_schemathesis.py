"""Property-based API testing: schemathesis drives every route of `/openapi.json` against the real stack.

The stack (nats-server, placement, admission, and two engine hosts heartbeating into
`sf_engines`) runs on its own event loop in a thread, because schemathesis calls the
API synchronously. Every response must be a documented status with a body matching its
schema and content type, never a 5xx.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.config import SchemathesisConfig

from libs import bus, names
from libs.natsd import NatsServer
from libs.schemas.base import encode
from services.admission.openapi import OPENAPI
from services.placement.service import PlacementConfig, PlacementService
from tests.support.admission import ADMIN_TOKEN, admission_config
from tests.support.fleet_rows import host

# A schema-valid create may still be refused: 422 for a contract incoherent with itself or with the
# backends the fleet measures (rules a static JSON Schema cannot state), 429 while the queue is full.
# An invalid body too large to read is refused 413 before it is looked at: a rejection like a 400.
CONFIG = SchemathesisConfig.from_dict({"checks": {
    "positive_data_acceptance": {"expected-statuses": ["2xx", "401", "403", "404", "422", "429"]},
    "negative_data_rejection": {"expected-statuses": ["400", "401", "403", "404", "405", "406", "409", "413",
                                                      "415", "422", "428", "429", "5xx"]}}})
# The operator's move needs fence's session log and the mover, which this stack does not run; its
# route and document agree by tests/admission/test_openapi_routes.py, and the browser tests move for real.
schema = schemathesis.openapi.from_dict(OPENAPI, config=CONFIG).exclude(
    path="/v1/admin/sessions/{session_id}/move")


class Stack:
    """The services on a private loop in a daemon thread; `stop` undoes `start` in reverse."""

    def __init__(self, store_dir) -> None:
        self.server = NatsServer(store_dir=store_dir).start()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.base_url = self._run(self._start())

    def _run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=60)

    async def _start(self) -> str:
        from services.admission.service import AdmissionService

        self.placement = PlacementService(PlacementConfig(nats_url=self.server.url))
        await self.placement.start()
        self.admission = AdmissionService(admission_config(self.server.url, queue_capacity=4,
                                                           queue_timeout_s=1.0, reservation_settle_s=1.0))
        await self.admission.start()
        self.nc = await bus.connect(self.server.url, name="engines")
        self.engines = await bus.ensure_kv(self.nc.jetstream(), names.ENGINES_BUCKET, ttl_s=6.0)
        self.beating = asyncio.create_task(self._beat())
        return f"http://127.0.0.1:{self.admission.http_port}"

    async def _beat(self) -> None:
        while True:
            for h, busy in (("h0", 0.5), ("h1", 0.8)):
                await self.engines.put(h, encode(host(h, busy=busy, at=time.time())))
            await asyncio.sleep(0.5)

    async def _stop(self) -> None:
        self.beating.cancel()
        await asyncio.gather(self.beating, return_exceptions=True)
        await self.nc.close()
        await self.admission.stop()
        await self.placement.stop()

    def stop(self) -> None:
        self._run(self._stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()
        self.server.stop()


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    s = Stack(tmp_path_factory.mktemp("nats"))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def http_session():
    with requests.Session() as session:
        yield session


@schema.parametrize()
@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
def test_api_conforms_to_its_openapi_document(case, stack, http_session):
    case.call_and_validate(base_url=stack.base_url, session=http_session,
                           headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})


def test_served_document_is_the_one_tested(stack, http_session):
    assert http_session.get(f"{stack.base_url}/openapi.json").json() == OPENAPI
