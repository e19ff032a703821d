"""A session admission queues because no host has room is load the autoscaler acts on: under
`statefleet up --autoscale 1:2` with two session slots a host, a third session waits in admission's
queue, placement starts a second engine host for it, and the session is placed there and streams,
although the fleet's average utilisation alone would never have asked for a host."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest

from bench.frontend import SessionClient, c1_contract, create
from bench.stack import UpStack
from libs import bus, names
from libs.schemas.engine import OutputChunk

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

QUEUE_TIMEOUT_S = 90.0
# Two slots a host; no pool of any kind and no rebalancing: only the queue can ask for the second host.
ENV = {"SF_MAX_SESSIONS_PER_HOST": "2", "SF_CONTROL_S": "0.5", "SF_KEEP_WARM_S": "0", "SF_REBALANCE": "false",
       "SF_WARM_POOL_HOSTS": "0", "SF_WARM_POOL_FRAC": "0", "SF_PROVISION_LEAD_S": "0",
       "SF_SCALE_OUT_COOLDOWN_S": "0", "SF_SCALE_IN_COOLDOWN_S": "600", "SF_QUEUE_TIMEOUT_S": str(QUEUE_TIMEOUT_S),
       "SF_HEARTBEAT_S": "0.5", "SF_TORCH_THREADS": "1", "SF_PROFILE_BLOCKS": "1"}


async def view(http: aiohttp.ClientSession, url: str, sid: str) -> dict:
    async with http.get(f"{url}/v1/sessions/{sid}") as r:
        return await r.json(content_type=None)


async def test_a_queued_session_makes_the_fleet_scale_out_and_is_placed_on_the_new_host(tmp_path):
    stack = UpStack(tmp_path / "var", autoscale="1:2", env=ENV).start()
    http = nc = None
    try:
        await stack.ready()
        nc = await bus.connect(stack.cli_url(), name="queue-scale-out-test")
        http = aiohttp.ClientSession(headers=stack.admin_headers())
        for seed in (1, 2):  # engine-0's two slots
            status, body = await create(http, stack.admission_url, c1_contract(), seed=seed)
            assert status == 201 and body["host_id"] == "engine-0", (status, body)
        status, body = await create(http, stack.admission_url, c1_contract(), seed=3)
        assert status == 202, (status, body)  # queued: no host has a slot
        client = SessionClient(sid=body["session_id"], token=body["input_token"], input_url=body["input_url"],
                               host_id="", period_s=body["contract"]["period_ms"] / 1000)
        await bus.subscribe_events(nc, names.output_subject(client.sid), OutputChunk, client.on_chunk)
        deadline = time.monotonic() + QUEUE_TIMEOUT_S
        while (v := await view(http, stack.admission_url, client.sid)).get("state") == "queued":
            assert time.monotonic() < deadline, "still queued: no host was started for it"
            await asyncio.sleep(0.5)
        assert v["state"] == "placed" and v["host_id"] == "engine-1", v
        for _ in range(100):  # it streams from the new host
            if len(client.live_blocks()) >= 3:
                break
            await asyncio.sleep(0.2)
        assert len(client.live_blocks()) >= 3
    finally:
        if http is not None:
            await http.close()
        if nc is not None:
            await nc.close()
        out = stack.stop()
    assert "started (autoscaled" in out, out[-3000:]
