"""The floor under bench.webrtc's WebRTC figures, measured in the same run: no engine, bus or fence, only a bare
aiortc sender (256x256 VP8 at 25 fps and 16 kHz Opus, each frame handed to the encoder at its media time, as
fence's playout does) and a receiver on loopback:

- `chromium`: the same Chromium, in a blank page, presenting the track (requestVideoFrameCallback), the offer and
  answer passed through Playwright;
- `aiortc`: a second aiortc peer in this process, the frame's time out of its decoder (the issue's own
  reference: p50 51.5 / p95 54.0 ms, inter-arrival 40.0 +- 2.6 ms).

Per receiver: glass_to_glass_ms_p50/p95 (frame handed to the encoder to presented / decoded) and
frame_interval_jitter_ms_p95 (|interval - 40 ms| of consecutive frames), as bench.webrtc computes them;
for Chromium also av_skew_ms_p95, sampled as bench.webrtc samples it (the sender's tone and frames share
one clock, so what it shows is the skew aiortc's sender reports and Chromium plays with no engine or fence).
RTP timestamps carry a random origin: a received frame is mapped to its sent frame by the first one received,
the first sent (a key frame), as the session page maps frames to blocks.
"""

from __future__ import annotations

import asyncio
import contextlib
import fractions
import time

import av
import numpy as np
from aiortc import MediaStreamTrack, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError

from bench.common import percentile
from libs import rtc_ice

SIZE, FPS, CLOCK, AUDIO_RATE = 256, 25, 90_000, 16_000
RECEIVER_JS = """async () => {
    document.body.innerHTML = '<video id="v" autoplay muted playsinline></video>';
    const v = document.getElementById('v'), pc = new RTCPeerConnection({iceServers: []}), stream = new MediaStream();
    pc.addTransceiver('video', {direction: 'recvonly'});
    pc.addTransceiver('audio', {direction: 'recvonly'});
    pc.ontrack = (e) => { stream.addTrack(e.track); v.srcObject = stream; v.play().catch(() => {}); };
    window.floor = {pc, frames: []};
    const shown = (now, m) => {
        window.floor.frames.push([performance.timeOrigin + m.presentationTime, m.rtpTimestamp]);
        v.requestVideoFrameCallback(shown);
    };
    v.requestVideoFrameCallback(shown);
    await pc.setLocalDescription(await pc.createOffer());
    await new Promise((resolve) => {
        if (pc.iceGatheringState === 'complete') return resolve();
        setTimeout(resolve, 3000);
        pc.addEventListener('icegatheringstatechange', () => pc.iceGatheringState === 'complete' && resolve());
    });
    return pc.localDescription.sdp;
}"""


async def _at(start: float | None, offset_s: float) -> float:
    """Wait until `offset_s` after `start` (monotonic; now when unset); the start."""
    now = time.monotonic()
    start = now if start is None else start
    if start + offset_s > now:
        await asyncio.sleep(start + offset_s - now)
    return start


PLAYOUT_JS = """async () => {
    const out = {};
    (await window.floor.pc.getStats()).forEach((s) => {
        if (s.type === 'inbound-rtp' && s.estimatedPlayoutTimestamp) out[s.kind] = s.estimatedPlayoutTimestamp;
    });
    return out;
}"""


class PacedVideo(MediaStreamTrack):
    """Moving frames, each returned at its media time; `sent[pts]` = wall ms it went to the encoder."""

    kind = "video"

    def __init__(self) -> None:
        super().__init__()
        self.start: float | None = None
        self.i = 0
        self.sent: dict[int, float] = {}
        ramp = np.arange(SIZE, dtype=np.uint8)
        self.base = np.stack([np.add.outer(ramp, ramp), np.add.outer(ramp, ramp[::-1]),
                              np.tile(ramp, (SIZE, 1))], axis=-1).astype(np.uint8)

    async def recv(self) -> av.VideoFrame:
        self.start = await _at(self.start, self.i / FPS)
        image = np.roll(self.base, 4 * self.i, axis=1)
        frame = av.VideoFrame.from_ndarray(image, format="rgb24")
        frame.pts, frame.time_base = self.i * CLOCK // FPS, fractions.Fraction(1, CLOCK)
        self.sent[frame.pts] = time.time() * 1000
        self.i += 1
        return frame


class PacedTone(MediaStreamTrack):
    kind = "audio"

    def __init__(self) -> None:
        super().__init__()
        self.start: float | None = None
        self.sample = 0

    async def recv(self) -> av.AudioFrame:
        self.start = await _at(self.start, self.sample / AUDIO_RATE)
        n = AUDIO_RATE // 50
        t = (self.sample + np.arange(n)) / AUDIO_RATE
        samples = (3000 * np.sin(2 * np.pi * 220 * t)).astype(np.int16).reshape(1, -1)
        frame = av.AudioFrame.from_ndarray(samples, format="s16", layout="mono")
        frame.sample_rate, frame.pts, frame.time_base = AUDIO_RATE, self.sample, fractions.Fraction(1, AUDIO_RATE)
        self.sample += n
        return frame


async def _sender(offer_sdp: str) -> tuple[RTCPeerConnection, PacedVideo, str]:
    rtc_ice.offer_only(rtc_ice.LOOPBACK)
    pc = RTCPeerConnection(rtc_ice.configuration())
    await pc.setRemoteDescription(RTCSessionDescription(
        sdp=rtc_ice.keep_candidates(offer_sdp, rtc_ice.LOOPBACK), type="offer"))
    video = PacedVideo()
    pc.addTrack(video)
    pc.addTrack(PacedTone())
    for t in pc.getTransceivers():
        t.direction = "sendonly"
    await pc.setLocalDescription(await pc.createAnswer())
    return pc, video, pc.localDescription.sdp


def figures(received: list[tuple[float, int]], sent: dict[int, float], since: float) -> dict:
    """received: [(wall ms, RTP timestamp)] in arrival order; sent: {pts: wall ms}; frames sent from `since`."""
    if not received or not sent:
        return {"glass_to_glass_ms_p50": None, "glass_to_glass_ms_p95": None, "frame_interval_jitter_ms_p95": None,
                "frames": 0}
    offset = received[0][1] - min(sent)
    matched = [(at, (rtp - offset) % (1 << 32)) for at, rtp in received]
    matched = [(at, pts) for at, pts in matched if pts in sent and sent[pts] >= since]
    g2g = [at - sent[pts] for at, pts in matched]
    jitter = [abs((b[0] - a[0]) - (b[1] - a[1]) / 90) for a, b in zip(matched, matched[1:], strict=False)]
    return {"glass_to_glass_ms_p50": percentile(g2g, 50), "glass_to_glass_ms_p95": percentile(g2g, 95),
            "frame_interval_jitter_ms_p95": percentile(jitter, 95), "frames": len(matched)}


async def chromium(browser, seconds: float) -> dict:
    ctx = await browser.new_context()
    page = await ctx.new_page()
    pc = None
    try:
        await page.goto("about:blank")
        pc, video, answer = await _sender(await page.evaluate(RECEIVER_JS))
        await page.evaluate("(sdp) => window.floor.pc.setRemoteDescription({type: 'answer', sdp})", answer)
        await page.wait_for_function("() => window.floor.frames.length >= 10", timeout=60_000)
        since, skews = time.time() * 1000, []
        end = time.monotonic() + seconds
        while time.monotonic() < end:  # A/V skew as bench.webrtc samples it: the streams' estimated playout
            await asyncio.sleep(0.25)
            playout = await page.evaluate(PLAYOUT_JS)
            if playout.get("audio") and playout.get("video"):
                skews.append(abs(playout["audio"] - playout["video"]))
        shown = await page.evaluate("window.floor.frames")
        return {**figures([(at, rtp) for at, rtp in shown], video.sent, since),
                "av_skew_ms_p95": percentile(skews, 95) if skews else None}
    finally:
        await ctx.close()
        if pc is not None:
            await pc.close()


async def aiortc_pair(seconds: float) -> dict:
    rtc_ice.offer_only(rtc_ice.LOOPBACK)
    receiver = RTCPeerConnection(rtc_ice.configuration())
    receiver.addTransceiver("video", direction="recvonly")
    receiver.addTransceiver("audio", direction="recvonly")
    got: list[tuple[float, int]] = []
    readers: list[asyncio.Task] = []
    started = asyncio.Event()

    async def read(track) -> None:
        with contextlib.suppress(MediaStreamError):
            while True:
                frame = await track.recv()
                if track.kind == "video":
                    got.append((time.time() * 1000, int(frame.pts or 0)))
                    if len(got) >= 10:
                        started.set()

    receiver.on("track", lambda track: readers.append(asyncio.create_task(read(track))))
    await receiver.setLocalDescription(await receiver.createOffer())
    sender, video, answer = await _sender(receiver.localDescription.sdp)
    try:
        await receiver.setRemoteDescription(RTCSessionDescription(
            sdp=rtc_ice.keep_candidates(answer, rtc_ice.LOOPBACK), type="answer"))
        await asyncio.wait_for(started.wait(), 60)
        since = time.time() * 1000
        await asyncio.sleep(seconds)
        return figures(list(got), video.sent, since)
    finally:
        for task in readers:
            task.cancel()
        await receiver.close()
        await sender.close()
