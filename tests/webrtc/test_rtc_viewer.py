"""A Python WebRTC viewer (aiortc) against fence's offer endpoint on a real stack."""

from __future__ import annotations

import pytest

from libs.rtc_viewer import RtcViewer
from tests.webrtc.conftest import create_session, rtc_url

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
