"""An item the session's backend cannot take is skipped and reported; it never stops the session's
input, nor that of whoever serves the session next."""

from __future__ import annotations

import json

import aiohttp
import msgspec

from libs import names
from libs.fence.ownership import assign
from libs.schemas.base import decode
from libs.schemas.engine import OutputChunk
from tests.support.engine_hosts import one_torch_thread, start_host  # noqa: F401  (autouse: one torch thread)
from tests.support.ownership import claimed_by
from tests.support.recovery import T1_CONTRACT, register
from tests.support.waiting import eventually


async def post(fence_svc, sid: str, token: str, body: dict) -> tuple[int, dict]:
    async with aiohttp.ClientSession(f"http://127.0.0.1:{fence_svc.http_port}") as http, \
            http.post(f"/v1/sessions/{sid}/items", json=body, headers={"Authorization": f"Bearer {token}"}) as r:
        return r.status, await r.json(content_type=None)


async def test_a_poison_item_is_skipped_reported_and_never_stops_the_session_or_its_successor(
        nats_server, nc, fence, tmp_path):  # noqa: F811
    rejected: list[dict] = []

    async def on_output(msg) -> None:
        chunk = decode(msg.data, OutputChunk)
        if chunk.kind == "input_rejected":
            rejected.append(msgspec.json.decode(chunk.data))

    await nc.subscribe(names.output_subject("p1"), cb=on_output)
    h1 = await start_host(nats_server.url, "h1", tmp_path, checkpoint_every_s=300.0)
    h2 = await start_host(nats_server.url, "h2", tmp_path, checkpoint_every_s=300.0)
    try:
        # registered without input kinds: ingress cannot refuse for the backend
        token = await register(nc, "p1", contract=T1_CONTRACT, seed=3)
        await assign(nc, "p1", "h1")
        await eventually(lambda: claimed_by(nc, "p1", "h1"))
        # seq 2 is a json item an avatar cannot take; seq 4 is text too long for it
        bodies = [{"kind": "text", "data": "one"}, {"kind": "json", "data": {"x": 1}},
                  {"kind": "text", "data": "three"}, {"kind": "text", "data": "x" * 1000},
                  {"kind": "text", "data": "five"}]
        for seq, body in enumerate(bodies, start=1):
            assert await post(fence, "p1", token, body) == (200, {"session_id": "p1", "seq": seq})

        async def consumed(host, n):
            return host.runtime.holds("p1") and host.runtime.info("p1").consumed_seq == n

        await eventually(lambda: consumed(h1, 5))
        info = h1.runtime.info("p1")
        assert (info.state, info.input_cursor, info.rejected_inputs, info.last_rejected_seq) == ("running", 5, 2, 4)
        await eventually(lambda: _async(len(rejected) == 2))
        assert [(r["seq"], r["code"]) for r in rejected] == [(2, "bad_request"), (4, "too_large")]

        # the next owner replays from the seed (no checkpoint was recorded): the same items are
        # released to it again, and again the refused ones are skipped
        await h1.assignments.stop()
        await h1.nc.close()
        await assign(nc, "p1", "h2")
        await eventually(lambda: claimed_by(nc, "p1", "h2"))
        assert await post(fence, "p1", token, {"kind": "text", "data": json.dumps("six")}) == \
            (200, {"session_id": "p1", "seq": 6})
        await eventually(lambda: consumed(h2, 6))
        assert h2.runtime.info("p1").state == "running"
    finally:
        await h2.stop()
        await h1.runtime.stop()


async def _async(value):
    return value
