"""Fence's WebRTC playout timeline (rtc_media.Playout) on a driven clock: blocks from the host's even grid,
one of them late. Latency must not keep the lateness: every later block waits at most MAX_AHEAD_S (plus a
frame) behind queued media; what is cut for it is counted; the frames played stay on the frame grid and in
order; a block's audio never runs past where its frames were cut. And the audio level fence announces per
frame is the one aiortc's sender writes in the packet (a viewer matches them to find the audio's media time)."""

from __future__ import annotations

import av
import numpy as np
from aiortc.rtp import compute_audio_level_dbov

from services.fence.rtc_blocks import BlockMedia
from services.fence.rtc_media import (
    AUDIO_FRAME,
    AUDIO_RATE,
    MAX_AHEAD_S,
    PLAYOUT_DELAY_S,
    VIDEO_CLOCK,
    Playout,
    audio_level,
)

PERIOD, FRAMES = 0.4, 10
STEP = PERIOD / FRAMES


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def block(index: int, kind: str) -> BlockMedia:
    if kind == "frames":
        return BlockMedia(index, "frames", PERIOD, 0, frames=np.full((FRAMES, 4, 4, 3), index, np.uint8))
    n = round(PERIOD * AUDIO_RATE)
    return BlockMedia(index, "audio", PERIOD, 0, audio=np.full(n, index, np.int16), sample_rate=AUDIO_RATE)


def test_a_late_block_does_not_leave_its_lateness_in_the_timeline():
    clock = Clock()
    announced: list[int] = []
    playout = Playout(lambda media, pts: announced.append(media.block), clock=clock)
    played, leads, delayed = [], {}, set()
    late = {5: 0.3, 11: 0.25, 12: 0.1}  # seconds late at fence (the host kept its grid)
    arrivals = sorted((100.0 + k * PERIOD + late.get(k, 0.0), k) for k in range(1, 20))
    for at, k in arrivals:
        while playout.frames and playout.frames[0].at <= at:  # the video track takes what is due
            clock.now = playout.frames[0].at
            played.append(playout.frames.popleft())
        clock.now = at
        playout.place(block(k, "frames"))
        leads[k] = playout.starts[k][0] - at
        if k - 1 in delayed:
            playout.place(block(k - 1, "audio"))
        if k % 2 == 0:  # its audio at once, placed before a cut; an odd block's comes after the next one's frames
            playout.place(block(k, "audio"))
        else:
            delayed.add(k)
    played += playout.frames
    assert all(lead <= PLAYOUT_DELAY_S + MAX_AHEAD_S + STEP + 1e-9 for lead in leads.values()), leads
    assert len(played) + playout.cut_frames == 19 * FRAMES, "every frame played or counted as cut"
    assert playout.cut_frames > 0, "the blocks after a late one cut into it"
    intervals = [(b.pts - a.pts) / VIDEO_CLOCK for a, b in zip(played, played[1:], strict=False)]
    assert all(i >= STEP - 1e-6 for i in intervals), "no frame sooner than a frame step after the one before"
    assert [f.block for f in played] == sorted(f.block for f in played), "blocks in order"
    assert playout.skipped_blocks == 19 - len({f.block for f in played})
    spans = sorted((first, first + samples.size, int(samples[0])) for first, samples in playout.audio if samples.size)
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False)), f"audio overlaps: {spans}"
    for _, end, k in spans:
        frames_of_k = [f for f in played if f.block == k]
        assert frames_of_k, f"audio of block {k}, whose frames were all cut"
        last_due = frames_of_k[-1].pts / VIDEO_CLOCK + STEP  # the end of its last frame played, from the origin
        assert end / AUDIO_RATE <= last_due + 1 / AUDIO_RATE, f"block {k}'s audio runs past its cut"


def test_the_audio_level_announced_is_the_one_aiortc_puts_in_the_packet():
    rng = np.random.default_rng(7)
    for scale in (0, 1, 30, 1000, 12000, 32767):
        samples = (rng.uniform(-1, 1, AUDIO_FRAME) * scale).astype(np.int16)
        frame = av.AudioFrame.from_ndarray(samples.reshape(1, -1), format="s16", layout="mono")
        assert audio_level(samples) == -compute_audio_level_dbov(frame), scale
