"""Voice items at fence, on a real fence and nats-server: bad audio and control items get typed 4xx
and store nothing; a flood of clears is refused with 429; a clear overtakes an owner's full queue.

Invariants: a refused item takes no seq (the next accepted one gets the next seq); the owner is
never released more than its credit, except through a clear, which is released at once with every
item before it, in order, exactly once."""

from __future__ import annotations

import asyncio
import base64

import pytest

from libs.fence import ownership, session_log
from libs.fence.client import EngineClient
from tests.support.fence import post, register, start_fence, stored_items
from tests.support.voice import BACKEND
from tests.support.waiting import eventually
from tests.voice.helpers import tone

UNAPPLIED = 4
KINDS = sorted(BACKEND.input_kinds)


def audio(seconds: float = 0.1, rate: int = 16000, **extra) -> dict:
    pcm = base64.b64encode(tone(seconds, rate=rate).astype("<i2").tobytes()).decode()
    return {"kind": "audio", "data": {"pcm": pcm, "sample_rate": rate, **extra}}


@pytest.fixture
async def voice_fence(nats_server):
    svc = await start_fence(nats_server.url_for("fence"), "fence-voice", max_unapplied_items=UNAPPLIED,
                            control_items_per_s=1.0, control_items_burst=2)
    yield svc
    await svc.stop()


async def test_bad_voice_items_are_typed_4xx_and_store_nothing(nc, voice_fence, http):
    token = await register(nc, "vb1", backend="talking_head", input_kinds=KINDS,
                           max_input_bytes=BACKEND.max_input_bytes)
    other = await register(nc, "vb2", backend="talking_head", input_kinds=KINDS,
                           max_input_bytes=BACKEND.max_input_bytes)
    ok = await post(http, voice_fence, "vb1", token, audio())
    assert ok == (200, {"session_id": "vb1", "seq": 1})
    odd = base64.b64encode(b"\x01\x02\x03").decode()
    bad = [
        (audio(rate=24000), 422, "unsupported_input"),  # a rate the backend does not take
        (audio(channels=2), 422, "unsupported_input"),
        (audio(format="f32le"), 400, "schema"),
        (audio(extra_field=1), 400, "schema"),
        ({"kind": "audio", "data": {"pcm": "", "sample_rate": 16000}}, 400, "bad_request"),  # empty
        ({"kind": "audio", "data": odd}, 400, "bad_request"),  # half a sample
        ({"kind": "audio", "data": "not base64!"}, 400, "bad_request"),
        ({"kind": "audio", "data": [1, 2]}, 400, "bad_request"),
        (audio(1.5), 413, "too_large"),  # over the backend's largest item
        ({"kind": "clear", "data": {"reason": 5}}, 400, "schema"),
        ({"kind": "clear", "data": "now"}, 400, "bad_request"),
        ({"kind": "segment_end", "data": {"v": 2}}, 400, "schema"),
        ({"kind": "text", "data": "hello"}, 422, "unsupported_input"),
    ]
    for body, status, code in bad:
        got_status, got = await post(http, voice_fence, "vb1", token, body)
        assert (got_status, got["code"]) == (status, code), body
    # control items with another session's token, or none
    assert (await post(http, voice_fence, "vb1", other, {"kind": "clear", "data": {}}))[0] in (401, 403)
    assert (await post(http, voice_fence, "vb1", None, {"kind": "segment_end", "data": {}}))[0] == 401
    assert [i.seq for i in await stored_items(nc.jetstream(), "vb1")] == [1]  # nothing of those stored
    assert await post(http, voice_fence, "vb1", token, {"kind": "segment_end", "data": {}}) == \
        (200, {"session_id": "vb1", "seq": 2})


async def test_a_flood_of_clears_is_refused_with_429_and_changes_nothing(nc, voice_fence, http):
    token = await register(nc, "vf1", backend="talking_head", input_kinds=KINDS,
                           max_input_bytes=BACKEND.max_input_bytes)
    answers = [await post(http, voice_fence, "vf1", token, {"kind": "clear", "data": {}}) for _ in range(10)]
    accepted = [a["seq"] for s, a in answers if s == 200]
    refused = {(s, a["code"], a.get("reason")) for s, a in answers if s != 200}
    assert accepted[:2] == [1, 2] and len(accepted) < 10  # the burst, then perhaps one a second
    assert refused == {(429, "busy", "control_rate")}
    assert [i.seq for i in await stored_items(nc.jetstream(), "vf1")] == accepted
    assert (await post(http, voice_fence, "vf1", token, audio()))[1]["seq"] == len(accepted) + 1  # audio goes on


async def test_a_clear_overtakes_an_owners_full_queue(nc, voice_fence, http):
    token = await register(nc, "vq1", backend="talking_head", input_kinds=KINDS,
                           max_input_bytes=BACKEND.max_input_bytes)
    client = EngineClient(nc, nc.jetstream(), "e1")
    await client.start()
    try:
        a = await ownership.assign(nc, "vq1", "e1")
        lease = await client.claim("vq1", a.version, cursor=0)  # claimed, applying nothing yet
        await lease.report_applied(0)  # and saying so: its credit stays UNAPPLIED items
        for _ in range(12):
            assert (await post(http, voice_fence, "vq1", token, audio()))[0] == 200
        await eventually(lambda: lease.backlog == UNAPPLIED)
        await asyncio.sleep(0.2)
        assert (await session_log.read_tail(nc.jetstream(), "vq1")).view.released == UNAPPLIED  # held
        status, body = await post(http, voice_fence, "vq1", token, {"kind": "clear", "data": {}})
        assert (status, body["seq"]) == (200, 13)
        await eventually(lambda: lease.backlog == 13)  # released through the clear, nothing applied
        got = []

        async def take() -> None:
            async for item in lease:
                got.append(item)
                if len(got) == 13:
                    return

        await asyncio.wait_for(take(), 10)
        assert [i.seq for i in got] == list(range(1, 14)) and got[-1].kind == "clear"
    finally:
        await client.close()
