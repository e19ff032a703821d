"""Failover tests run on the shared in-process stack (`tests/support/stack.py`)."""

from __future__ import annotations

import pytest

from tests.support.stack import Stack


@pytest.fixture
async def stack(nats_server, nc, tmp_path):
    s = Stack(nc, nats_server.url, tmp_path)
    yield s
    await s.stop()
