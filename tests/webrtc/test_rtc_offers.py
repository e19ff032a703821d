"""Hostile and over-limit offers: each gets a 4xx (or 503) problem and changes nothing: no peer connection
is left, no other viewer is disturbed, the session goes on with the same owner. Viewers that never finish
negotiating or stop reading are dropped, and counted."""

from __future__ import annotations

import asyncio
import dataclasses
import signal
import sys

import msgspec
import pytest
from aiortc import RTCPeerConnection

from libs import rtc_ice
from libs.rtc_viewer import RtcViewer, offer
from tests.support.metrics import refused
from tests.support.waiting import eventually
from tests.support.web_stack import rtc_url

pytestmark = pytest.mark.asyncio(loop_scope="module")


async def real_offer(data_channel: bool = True) -> tuple[RTCPeerConnection, str]:
    rtc_ice.offer_only(rtc_ice.LOOPBACK)
    pc = RTCPeerConnection(rtc_ice.configuration())
    pc.addTransceiver("video", direction="recvonly")
    if data_channel:
        pc.createDataChannel("sf")
    await pc.setLocalDescription(await pc.createOffer())
    return pc, pc.localDescription.sdp


async def test_hostile_offers_are_refused_and_change_nothing(stack, sessions):
    created = await sessions()
    url, token = rtc_url(created), created["input_token"]
    watcher = RtcViewer(url, token, audio=False)
    await watcher.connect()
    pc, sdp = await real_offer()
    no_channel, sdp_without_channel = await real_offer(data_channel=False)
    try:
        await watcher.wait_for(lambda: len(watcher.blocks) >= 2 and watcher.owners)
        owner_before = watcher.owners[-1]
        cases = {
            "wrong token": (401, await offer(url, token[::-1], sdp)),
            "no token": (401, await offer(url, "", sdp)),
            "other session's url": (401, await offer(url.replace(created["session_id"], "0" * 32), token, sdp)),
            "malformed SDP": (400, await offer(url, token, "v=0\r\no=garbage\r\nm=video\r\n")),
            "binary SDP": (400, await offer(url, token, "\x00\xff" * 100)),
            "not JSON": (400, await offer(url, token, "", content=b"{\"type\": \"offer\", \"sdp\"")),
            "an answer": (400, await offer(url, token, "", content=msgspec.json.encode({"type": "answer", "sdp": sdp}))),
            "no data channel": (400, await offer(url, token, sdp_without_channel)),
            "huge SDP": (413, await offer(url, token, sdp + "a=x-pad:" + "x" * 40_000 + "\r\n")),
            "huger than any body": (413, await offer(url, token, sdp + "a=x-pad:" + "x" * 200_000 + "\r\n")),
            "SDP lines reordered": (400, await offer(url, token, "\r\n".join(reversed(sdp.split("\r\n"))))),
        }
        for what, (want, (status, body)) in cases.items():
            assert status == want, (what, status, body)
            assert body["status"] == status and "sdp" not in body, what
        assert list(stack.fence.rtc.peers) == [watcher.peer_id], "a refused offer leaves no peer behind"
        seen = len(watcher.blocks)
        await watcher.wait_for(lambda: len(watcher.blocks) >= seen + 2)
        assert watcher.owners[-1] == owner_before and watcher.pc.connectionState == "connected"
    finally:
        await pc.close()
        await no_channel.close()
        await watcher.close()
    await eventually(lambda: not stack.fence.rtc.peers)


async def test_viewers_per_session_and_per_server_are_bounded(stack, sessions):
    created = await sessions()
    url, token = rtc_url(created), created["input_token"]
    rtc = stack.fence.rtc
    limits = rtc.limits
    rtc.limits = dataclasses.replace(limits, max_peers_per_session=1, max_peers=2)
    first, other = RtcViewer(url, token, audio=False), None
    try:
        await first.connect()
        pc, sdp = await real_offer()
        status, body = await offer(url, token, sdp)
        assert status == 429 and body["max_peers_per_session"] == 1
        other_session = await sessions()
        other = RtcViewer(rtc_url(other_session), other_session["input_token"], audio=False)
        await other.connect()
        status, body = await offer(rtc_url(other_session), other_session["input_token"], sdp)
        assert status == 503 and body["retryable"], "the server's bound holds before the session's"
        assert len(rtc.peers) == 2
        await pc.close()
    finally:
        rtc.limits = limits
        for viewer in (first, other):
            if viewer is not None:
                await viewer.close()
    await eventually(lambda: not rtc.peers)


async def test_a_viewer_that_never_completes_negotiation_is_dropped(stack, sessions):
    created = await sessions()
    rtc = stack.fence.rtc
    limits = rtc.limits
    rtc.limits = dataclasses.replace(limits, negotiation_timeout_s=1.0)
    pc, sdp = await real_offer()
    try:
        status, answer = await offer(rtc_url(created), created["input_token"], sdp)
        assert status == 200 and answer["peer_id"] in rtc.peers  # answered, but the viewer never applies it
        await eventually(lambda: answer["peer_id"] not in rtc.peers, timeout_s=30)
        assert not rtc.by_session
    finally:
        rtc.limits = limits
        await pc.close()


VIEWER = """
import asyncio, sys
from libs.rtc_viewer import RtcViewer

async def main():
    viewer = RtcViewer(sys.argv[1], sys.argv[2], audio=False)
    await viewer.connect()
    print(viewer.peer_id, flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


async def test_a_viewer_that_stops_reading_is_dropped_and_counted(stack, sessions):
    """A viewer process frozen (SIGSTOP) acknowledges nothing: what fence sends it piles up unsent, and past
    max_buffered_bytes the peer is closed as a slow reader (counted), while a viewer that reads goes on."""
    created = await sessions()
    url, token = rtc_url(created), created["input_token"]
    rtc = stack.fence.rtc
    limits = rtc.limits
    rtc.limits = dataclasses.replace(limits, max_buffered_bytes=4096)  # a few seconds of block messages
    before = await refused(stack.fence, "sf_fence_rtc_refused_total", "slow_reader")
    reader = RtcViewer(url, token, audio=False)
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", VIEWER, url, token,
                                                stdout=asyncio.subprocess.PIPE)
    try:
        await reader.connect()
        frozen_id = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode().strip()
        frozen = rtc.peers[frozen_id]
        await eventually(lambda: frozen.playout.first_pts is not None, timeout_s=60, what="the frozen viewer served")
        proc.send_signal(signal.SIGSTOP)
        await eventually(lambda: frozen_id not in rtc.peers, timeout_s=120, what="the frozen viewer dropped")
        assert frozen.reason == "viewer stopped reading", frozen.reason
        assert await refused(stack.fence, "sf_fence_rtc_refused_total", "slow_reader") == before + 1
        seen = len(reader.blocks)
        await reader.wait_for(lambda: len(reader.blocks) >= seen + 2)
        assert list(rtc.peers) == [reader.peer_id] and reader.pc.connectionState == "connected"
    finally:
        rtc.limits = limits
        proc.kill()
        await proc.wait()
        await reader.close()
    await eventually(lambda: not rtc.peers)
