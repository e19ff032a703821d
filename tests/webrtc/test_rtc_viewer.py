"""A Python WebRTC viewer (aiortc) against fence's offer endpoint on a real stack."""

from __future__ import annotations

import aiohttp
import pytest

from libs.rtc_viewer import RtcViewer
from tests.browser.conftest import ADMIN_TOKEN
from tests.webrtc.conftest import create_session, eventually, rtc_url

pytestmark = pytest.mark.asyncio(loop_scope="module")


async def test_a_viewer_receives_moving_video_audio_and_block_events(stack):
    created = await create_session(stack)
    viewer = RtcViewer(rtc_url(created), created["input_token"])
    await viewer.connect()
    try:
        await viewer.wait_for(lambda: len(viewer.blocks) >= 3 and len(viewer.frames) >= 20 and viewer.owners)
        assert len({round(f.mean, 3) for f in viewer.frames}) > 1, "the video should move"
        indices = [b["index"] for b in viewer.blocks]
        assert indices == sorted(set(indices)), "each block once, in order"
        assert viewer.owners[-1]["version"] == 1
        await viewer.wait_for(lambda: any(s.mean > 100 for s in viewer.sound))
    finally:
        await viewer.close()


async def test_input_over_the_data_channel_is_checked_stored_and_answered_in_order(stack):
    created = await create_session(stack)
    viewer = RtcViewer(rtc_url(created), created["input_token"], audio=False)
    await viewer.connect()
    try:
        first = await viewer.send({"kind": "text", "data": "good morning", "id": "item-1"})
        assert first == {"seq": 1, "id": "item-1"}
        again = await viewer.send({"kind": "text", "data": "good morning", "id": "item-1"})
        assert again == {"seq": 1, "duplicate": True, "id": "item-1"}, "a resent id is stored once"
        wrong = await viewer.send({"kind": "action", "data": {"keys": ["w"]}, "id": "item-2"})
        assert wrong["error"]["status"] == 422 and wrong["id"] == "item-2", "the avatar takes no actions"
        viewer.channel.send("{not json")
        assert (await viewer._acks.get())["error"]["status"] == 400
        second = await viewer.send({"kind": "text", "data": "x" * (128 * 1024)})
        assert second["error"]["status"] == 413
        third = await viewer.send({"kind": "text", "data": "and goodbye"})
        assert third == {"seq": 2}, "refused items take no seq"
        await viewer.wait_for(lambda: any(b["input_seq"] >= 2 for b in viewer.blocks))
    finally:
        await viewer.close()


async def test_a_live_move_keeps_the_connection_and_plays_every_block_once(stack):
    created = await create_session(stack)
    sid = created["session_id"]
    viewer = RtcViewer(rtc_url(created), created["input_token"])
    await viewer.connect()
    try:
        await viewer.wait_for(lambda: len(viewer.blocks) >= 2 and viewer.owners)
        owner = viewer.owners[-1]["server_id"]
        other = next(h.host_id for h in stack.hosts if h.host_id != owner)
        async with aiohttp.ClientSession() as http, http.post(
                f"{stack.origin}/v1/admin/sessions/{sid}/move", json={"to": other},
                headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as r:
            receipt = await r.json()
            assert r.status == 200 and receipt["outcome"] == "committed", receipt
        await viewer.wait_for(lambda: any(b["owner"] == [other, 2] for b in viewer.blocks[-1:]))
        moved_at = len(viewer.blocks)
        await viewer.wait_for(lambda: len(viewer.blocks) >= moved_at + 2)
        indices = [b["index"] for b in viewer.blocks]
        assert indices == sorted(set(indices)), f"every block at most once, in order, across the move: {indices}"
        missing = indices[-1] - indices[0] + 1 - len(indices)
        assert missing == viewer.blocks[-1]["skipped_blocks"] - viewer.blocks[0]["skipped_blocks"], \
            f"a block not shown is one cut from a backlog, and counted: {indices}"
        assert [(o["server_id"], o["version"]) for o in viewer.owners if o["claimed"]][-1] == (other, 2)
        assert viewer.pc.connectionState == "connected" and len(stack.fence.rtc.peers) == 1, \
            "one peer connection throughout"
        assert viewer.blocks[-1]["replays_dropped"] == 0
    finally:
        await viewer.close()
    await eventually(lambda: not stack.fence.rtc.peers)
