"""A SIGKILL of the owning engine host: the viewer's one peer connection resumes with the replacement's
blocks (frames keep coming, and they move), and no block plays twice (the replacement's replays of blocks already played are dropped)."""

from __future__ import annotations

import uuid

import pytest

from libs.rtc_viewer import RtcViewer
from tests.support.stack import Stack
from tests.support.waiting import eventually

pytest.importorskip("aiortc", reason="the webrtc extra (`make install` installs it)")


@pytest.fixture
async def procs(nats_server, nc, tmp_path):
    s = Stack(nc, nats_server.url, tmp_path)
    yield s
    await s.stop()


async def test_sigkill_of_the_owning_host_resumes_playback_on_the_same_connection(procs):
    await procs.start()
    await procs.engines_up("e0", "e1")
    sid = uuid.uuid4().hex
    placement = await procs.create(sid)
    url = f"http://127.0.0.1:{procs.fence.http_port}/v1/sessions/{sid}/rtc"
    viewer = RtcViewer(url, procs.tokens[sid])
    await viewer.connect()
    try:
        await viewer.wait_for(lambda: len(viewer.blocks) >= 3)
        procs.engines[placement.host_id].kill()
        survivor = next(h for h in procs.engines if h != placement.host_id)
        await viewer.wait_for(lambda: any(o["server_id"] == survivor and o["claimed"] for o in viewer.owners),
                              timeout_s=120)
        await viewer.wait_for(lambda: sum(b["owner"][0] == survivor for b in viewer.blocks if b["owner"]) >= 3,
                              timeout_s=120)
        indices = [b["index"] for b in viewer.blocks]
        assert indices == sorted(set(indices)), f"no block twice, in order: {indices}"
        assert viewer.pc.connectionState == "connected" and list(procs.fence.rtc.peers) == [viewer.peer_id]
        frames_before = len(viewer.frames)
        await viewer.wait_for(lambda: len(viewer.frames) > frames_before + 20)
        assert len({round(f.mean, 3) for f in viewer.frames[frames_before:]}) > 1, "the replacement's video moves"
    finally:
        await viewer.close()
    await eventually(lambda: not procs.fence.rtc.peers)
