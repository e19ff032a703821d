"""Overload relief on a real stack (issue 23 item 3): a C1 session no device can keep is suspended and re-queued
as `capacity_lost`, said in its summary and by `statefleet status`, and its client gets a typed notice; it stays
suspended while the device is still measured past its limit, and resumes once the device has room.

The noisy neighbour is a second engine host on the same machine (so the same device) announcing a co-tenant's
device time (`co_tenant_fraction`): the device's measured load passes the limit whatever the sessions' prices
say, and the only way out is the neighbour leaving."""

from __future__ import annotations

import asyncio
import json
import sys

import aiohttp

from libs import bus, names
from libs.schemas.base import decode
from libs.schemas.common import SessionSummary
from tests.support.fleet import holder
from tests.support.stack import CONTRACT
from tests.support.waiting import eventually


async def test_a_c1_session_no_device_can_keep_is_re_queued_as_capacity_lost_and_resumes_once_there_is_room(stack):
    await stack.start(fleet_control=True, control_s=0.2, rebalance=False, relieve_overload=True)
    await stack.engines_up("e0")
    await stack.create("c1", contract=CONTRACT)
    notices: asyncio.Queue[dict] = asyncio.Queue()
    url = f"http://127.0.0.1:{stack.fence.http_port}/v1/sessions/c1/output"
    async with aiohttp.ClientSession() as http, \
            http.ws_connect(url, headers={"Authorization": f"Bearer {stack.tokens['c1']}"}) as ws:
        reader = asyncio.create_task(_notices(ws, notices))
        try:
            # the neighbour arrives: e1 shares e0's device and announces a co-tenant taking 0.95 of it
            await stack.engines_up("e1", SF_CO_TENANT_FRACTION="0.95")
            lost = await asyncio.wait_for(notices.get(), 60)
            assert (lost["session_id"], lost["kind"]) == ("c1", "capacity_lost"), lost
            assert "measured past its limit" in lost["reason"]
            summary = await eventually(lambda: _summary(stack, "c1", shed="capacity_lost"), 20)
            assert summary.state == "suspended" and summary.reason.startswith("capacity_lost"), summary
            info = await eventually(lambda: _state(stack, "e0", "c1", "suspended"), 20)
            assert info.state == "suspended"
            shown = await _status(stack.url)
            row = next(line for line in shown.splitlines() if line.strip().startswith("c1 "))
            assert "suspended" in row and "capacity_lost" in row, shown
            assert "OVER CAPACITY" in shown, shown

            # Re-queued, not bouncing: while the device is still measured past its limit, rounds go by and the
            # session stays suspended, with new input coming in.
            await stack.send("c1", 1, 2)
            fleet = holder(stack).fleet
            seen = fleet.rounds
            await eventually(lambda: fleet.rounds >= seen + 10, 30)
            assert (await stack.info("e0", "c1")).state == "suspended"
            assert notices.empty()

            # The neighbour leaves: its heartbeat stops, the device has room, the session resumes.
            stack.engines["e1"].stop()
            back = await asyncio.wait_for(notices.get(), 60)
            assert (back["session_id"], back["kind"]) == ("c1", "resumed"), back
            await eventually(lambda: _state(stack, "e0", "c1", "running"), 20)
            summary = await eventually(lambda: _summary(stack, "c1", shed=""), 20)
            assert summary.state == "serving" and not summary.reason, summary
            await eventually(lambda: stack.consumed("c1", 2), 30)  # the input sent while it waited is served
        finally:
            reader.cancel()


async def _notices(ws: aiohttp.ClientWebSocketResponse, into: asyncio.Queue[dict]) -> None:
    async for msg in ws:
        if msg.type == aiohttp.WSMsgType.TEXT and "notice" in (body := json.loads(msg.data)):
            await into.put(body["notice"])


async def _summary(stack, sid: str, *, shed: str) -> SessionSummary | None:
    kv = await stack.js.key_value(names.SESSIONS_BUCKET)
    entry = await bus.kv_read(kv, sid)
    if entry is None or not entry.value:
        return None
    s = decode(entry.value, SessionSummary)
    return s if s.shed == shed else None


async def _state(stack, host_id: str, sid: str, want: str):
    info = await stack.info(host_id, sid)
    return info if info is not None and info.state == want else None


async def _status(url: str) -> str:
    """`statefleet status` as an operator runs it (its own process: the stack's services keep running)."""
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "statefleet", "status", "--nats-url", url,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    return out.decode()
