"""Engine hosts take fenced sessions: claim on assignment, input only from their lease, failover
from the checkpoint fence recorded, with every accepted item applied exactly once."""

from __future__ import annotations

import json

import aiohttp

from libs import bus, names
from libs.fence.ownership import assign
from libs.schemas.fence import MetaRequest, SessionMeta
from services.fence.service import FenceService
from tests.support.engine_hosts import start_host
from tests.support.ownership import claimed_by
from tests.support.recovery import T1_CONTRACT, register
from tests.support.waiting import eventually


async def post_items(fence: FenceService, sid: str, token: str, texts: list[str], *, first_seq: int) -> None:
    """Post each item; each is stored durably as the session's next seq before the answer comes."""
    async with aiohttp.ClientSession(f"http://127.0.0.1:{fence.http_port}") as http:
        for seq, text in enumerate(texts, start=first_seq):
            async with http.post(f"/v1/sessions/{sid}/items", json={"kind": "text", "data": text},
                                 headers={"Authorization": f"Bearer {token}"}) as resp:
                assert resp.status == 200, await resp.text()
                assert await resp.json() == {"session_id": sid, "seq": seq}


async def test_assigned_session_is_claimed_and_takes_only_fenced_input(nats_server, nc, fence, tmp_path):
    host = await start_host(nats_server.url, "h1", tmp_path)
    try:
        token = await register(nc, "s1", contract=T1_CONTRACT, seed=3)
        await assign(nc, "s1", "h1")
        await eventually(lambda: claimed_by(nc, "s1", "h1"))
        await post_items(fence, "s1", token, [f"line {i}" for i in range(1, 6)], first_seq=1)

        async def consumed():
            return host.runtime.holds("s1") and host.runtime.info("s1").consumed_seq == 5

        await eventually(consumed)
        assert host.runtime.info("s1").input_cursor == 5
    finally:
        await host.stop()


async def test_failover_restores_the_checkpoint_and_applies_every_item_once(nats_server, nc, fence, tmp_path):
    h1 = await start_host(nats_server.url, "h1", tmp_path)
    h2 = await start_host(nats_server.url, "h2", tmp_path, checkpoint_every_s=300.0)
    try:
        token = await register(nc, "s2", contract=T1_CONTRACT, seed=3)
        await assign(nc, "s2", "h1")
        await eventually(lambda: claimed_by(nc, "s2", "h1"))
        await post_items(fence, "s2", token, [json.dumps(i) for i in range(1, 6)], first_seq=1)

        async def checkpointed():
            meta = await bus.request(nc, names.FENCE_META, MetaRequest(session_id="s2"), SessionMeta)
            return meta if meta.checkpoint_cursor == 5 else None

        meta = await eventually(checkpointed)
        assert meta.checkpoint_ref

        # h1 "dies": its bus connection goes, its sessions with it (nothing is handed over).
        await h1.assignments.stop()
        await h1.nc.close()
        await post_items(fence, "s2", token, [json.dumps(i) for i in range(6, 9)], first_seq=6)
        meta = await bus.request(nc, names.FENCE_META, MetaRequest(session_id="s2"), SessionMeta)
        await assign(nc, "s2", "h2")
        await eventually(lambda: claimed_by(nc, "s2", "h2"))

        async def caught_up():
            rt = h2.runtime
            return rt.holds("s2") and rt.info("s2").consumed_seq == 8

        await eventually(caught_up)
        # the runtime refuses gaps and duplicates, so a cursor of 8 means items 6..8 came exactly once
        assert h2.runtime.info("s2").input_cursor == 8
        assert h2.runtime.sessions.get("s2").checkpoint_key == meta.checkpoint_ref  # restored, not replayed
    finally:
        await h2.stop()
        await h1.runtime.stop()
