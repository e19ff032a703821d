"""The fleet controller on a real stack: the failover tests' stack (nats-server, fence, two placement
instances, the mover; engine hosts as processes) with the controller turned on per test."""

from __future__ import annotations

import pytest

from tests.failover.conftest import Stack


@pytest.fixture
async def stack(nats_server, nc, tmp_path):
    s = Stack(nc, nats_server.url, tmp_path)
    yield s
    await s.stop()


def holder(stack: Stack):
    """The placement instance holding the fleet lease (None while none does)."""
    return next((p for p in stack.placements if p.fleet.lease.held), None)


def configure(stack: Stack, **fields) -> None:
    """Change the controller's settings on every placement instance (read afresh every round)."""
    for p in stack.placements:
        for k, v in fields.items():
            setattr(p.config, k, v)
