"""Fixtures: a real nats-server per test (from the wheel), and a 3-node loopback cluster (slow)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings

from libs import bus
from libs.natsd import NatsServer, start_cluster

# Shared, noisy machines: a slow example is not a failure. Correctness properties still run in full.
settings.register_profile("statefleet", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("statefleet")


@pytest.fixture
def nats_server(tmp_path):
    """A fresh JetStream-enabled nats-server on a port it picked, torn down after the test."""
    server = NatsServer(store_dir=tmp_path / "nats").start()
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
