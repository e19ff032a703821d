"""A Python WebRTC viewer (aiortc) against fence's offer endpoint on a real stack."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from libs.rtc_viewer import RtcViewer
from services.fence.ingress import WS_WINDOW
from tests.support.waiting import eventually
from tests.support.web_stack import live_move, rtc_url

pytestmark = pytest.mark.asyncio(loop_scope="module")


async def test_a_viewer_receives_moving_video_audio_and_block_events(stack, sessions):
    created = await sessions()
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


async def test_input_over_the_data_channel_is_checked_stored_and_answered_in_order(stack, sessions):
    created = await sessions()
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


async def test_a_live_move_keeps_the_connection_and_plays_every_block_once(stack, sessions):
    created = await sessions()
    sid = created["session_id"]
    viewer = RtcViewer(rtc_url(created), created["input_token"])
    await viewer.connect()
    try:
        await viewer.wait_for(lambda: len(viewer.blocks) >= 2 and viewer.owners)
        owner = viewer.owners[-1]["server_id"]
        other = next(h.host_id for h in stack.hosts if h.host_id != owner)
        await live_move(stack, sid, other)
        await viewer.wait_for(lambda: any(b["owner"] and b["owner"][0] == other for b in viewer.blocks[-1:]))
        version = viewer.blocks[-1]["owner"][1]
        assert version > 1
        moved_at, frames_at = len(viewer.blocks), len(viewer.frames)
        await viewer.wait_for(lambda: len(viewer.blocks) >= moved_at + 2 and len(viewer.frames) >= frames_at + 20)
        assert len({round(f.mean, 3) for f in viewer.frames[frames_at:]}) > 1, "the new owner's video moves"
        indices = [b["index"] for b in viewer.blocks]
        assert indices == sorted(set(indices)), f"every block at most once, in order, across the move: {indices}"
        missing = indices[-1] - indices[0] + 1 - len(indices)
        assert missing == viewer.blocks[-1]["skipped_blocks"] - viewer.blocks[0]["skipped_blocks"], \
            f"a block not shown is one cut from a backlog, and counted: {indices}"
        assert [(o["server_id"], o["version"]) for o in viewer.owners if o["claimed"]][-1] == (other, version)
        assert viewer.pc.connectionState == "connected" and len(stack.fence.rtc.peers) == 1, \
            "one peer connection throughout"
        assert viewer.blocks[-1]["replays_dropped"] == 0
    finally:
        await viewer.close()
    await eventually(lambda: not stack.fence.rtc.peers)


async def test_at_most_a_window_of_items_is_unanswered_and_one_beyond_it_is_refused_unstored(stack, sessions, monkeypatch):
    """The data channel's input window (WS_WINDOW, as on the socket): with every store's answer held,
    the first WS_WINDOW items are taken for storing and the rest answered 429 in their turn, never stored."""
    created = await sessions()
    viewer = RtcViewer(rtc_url(created), created["input_token"], audio=False)
    await viewer.connect()
    appender = stack.fence.ingress.appender
    real_submit, taken, gate = appender.submit, [], asyncio.Event()

    def held_submit(*args, **kwargs) -> asyncio.Future:
        stored = real_submit(*args, **kwargs)  # stored for real; only its answer waits for the gate
        taken.append(stored)

        async def answer_after_gate():
            await gate.wait()
            return await stored
        return asyncio.ensure_future(answer_after_gate())

    monkeypatch.setattr(appender, "submit", held_submit)
    sent = WS_WINDOW + 6
    try:
        channel_input = stack.fence.rtc.peers[viewer.peer_id].input
        for i in range(sent):
            viewer.channel.send(msgspec.json.encode({"kind": "text", "data": f"item {i}", "id": f"w{i}"}).decode())
        await eventually(lambda: channel_input.unanswered == sent and len(taken) == WS_WINDOW, timeout_s=60,
                         what="every item read, the window's worth taken for storing")
        assert viewer._acks.empty(), "answers go in order: none before the first store's"
        gate.set()
        acks = [await asyncio.wait_for(viewer._acks.get(), 60) for _ in range(sent)]
        assert [a.get("id") for a in acks] == [f"w{i}" for i in range(sent)], acks
        seqs = [a.get("seq") for a in acks[:WS_WINDOW]]
        assert seqs == list(range(seqs[0], seqs[0] + WS_WINDOW)), acks[:WS_WINDOW]
        assert all(a["error"]["status"] == 429 and "unanswered" in a["error"]["detail"] for a in acks[WS_WINDOW:]), \
            acks[WS_WINDOW:]
        assert len(taken) == WS_WINDOW and channel_input.unanswered == 0
        monkeypatch.undo()
        after = await viewer.send({"kind": "text", "data": "after the window", "id": "after"})
        assert after == {"seq": seqs[-1] + 1, "id": "after"}, "the refused items took no seq"
    finally:
        gate.set()
        await viewer.close()
