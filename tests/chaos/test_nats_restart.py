"""A single-node NATS with file storage is SIGKILLed mid-traffic; `statefleet up` restarts it on the
same port and data directory, and the services and sessions carry on by themselves."""

from __future__ import annotations

import signal

import pytest

from tests.support.chaos import assert_clean, record

pytestmark = pytest.mark.chaos


async def test_single_node_nats_killed_and_restarted(drill, chaos_results):
    d = await drill(engines=2)
    await d.open(3)
    d.stack.signal("nats-server", signal.SIGKILL)
    at = d.fault("SIGKILL nats-server (single node, file storage)")
    await d.recovered(at)
    await d.serving()
    row = record(chaos_results, "nats_single_node_restart", d, await d.finish())
    assert_clean(row)
