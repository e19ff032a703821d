"""One viewer's playout: blocks placed on a wall-clock timeline, played by a video and an audio track.

Block k starts at `W_k = max(end of block k-1, now + PLAYOUT_DELAY_S)`: back to back while the
engine keeps real time, at once (a gap, not a backlog) when it falls behind. Back to back alone would
keep, for the rest of the connection, the worst lateness any block ever had: blocks come on the host's
even grid, so after one came late by d every later one waits d behind the media queued before it. So
a block is never queued more than MAX_AHEAD_S behind the earliest it could start: the queued media's
tail beyond that is cut (frames and audio, on the frame grid, counted in `cut_frames`), the browser's
jitter buffer, not this one, absorbs the network's jitter. Its frames are handed to
the encoder at `W_k + i * media_s / frames`, its audio samples from the sample at `W_k`; both tracks'
timestamps count from one origin, so audio and video of a block leave together (and the browser,
from the RTCP sender reports, plays them together). The audio track runs without a pause: 20 ms
frames of the block's samples, or of silence where there are none.

A change of owner is no event here: the new owner's blocks are the next blocks on the same
timeline, on the same tracks, with no renegotiation. Blocks that come in a burst (an engine faster
than real time) cut each other likewise: latency does not build up (the WebSocket page allows 2 s).
"""

from __future__ import annotations

import asyncio
import collections
import fractions
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import av
import numpy as np
from aiortc import MediaStreamTrack
from aiortc.mediastreams import MediaStreamError

from services.fence.rtc_blocks import BlockMedia

VIDEO_CLOCK = 90_000
AUDIO_RATE = 16_000
AUDIO_FRAME = AUDIO_RATE // 50  # 20 ms
PLAYOUT_DELAY_S = 0.02  # room for the audio of a block, which completes just after its frames
MAX_AHEAD_S = 0.06  # queued media a new block may wait behind: more is latency a live call should not keep
LATE_DROP_S = 0.25  # a frame the encoder could not take within this of its time is skipped, not shown late


@dataclass(slots=True)
class _Frame:
    at: float  # wall time (loop clock) it is due
    pts: int  # 90 kHz
    image: np.ndarray  # in `pixel_format` (rtc_blocks.BlockMedia): shared by every viewer of the block, never written
    pixel_format: str
    block: int
    starts: BlockMedia | None  # on the first frame of a block: its media (the data-channel message goes with it)


OnBlockStart = Callable[[BlockMedia, int], None]  # (the block's frames, its first frame's pts)


class Playout:
    """The timeline both tracks of one peer connection read from."""

    def __init__(self, on_block_start: OnBlockStart, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.on_block_start = on_block_start
        self.origin: float | None = None  # wall time of pts 0 (both tracks)
        self.end = 0.0  # wall time the last placed block ends
        self.starts: dict[int, list[float]] = {}  # block → [W_k, its end or where it was cut], for its audio
        self.frames: collections.deque[_Frame] = collections.deque()
        self.audio: collections.deque[tuple[int, np.ndarray]] = collections.deque()  # (first sample, samples)
        self.late_frames = 0
        self.first_pts: int | None = None  # the first frame handed to the encoder (its RTP timestamp's origin)
        self.cut_frames = 0  # frames not played because the media queued before a new block was cut
        self.skipped_blocks = 0  # blocks of those cut whole (never announced)
        # (first sample, RFC 6464 level) of the audio frames sent and not yet announced; the latest 2 s only,
        # so audio that plays on while no block comes (silence) does not pile up
        self.levels: collections.deque[tuple[int, int]] = collections.deque(maxlen=100)
        self.wake = asyncio.Event()
        self.closed = False

    def place(self, media: BlockMedia) -> None:
        now = self.clock()
        if self.origin is None:
            self.origin = now + PLAYOUT_DELAY_S
        if media.kind == "frames":
            earliest = now + PLAYOUT_DELAY_S
            start = max(self.end, earliest)
            if start - earliest > MAX_AHEAD_S:  # cut at the first queued frame due past the allowance
                start = next((f.at for f in self.frames if f.at >= earliest + MAX_AHEAD_S), self.end)
                self._cut(start)
            assert media.frames is not None
            n = media.frames.shape[0]
            step = media.media_s / n if media.media_s > 0 and n else 1 / 25
            self.end = start + n * step
            self.starts[media.block] = [start, self.end]
            for b in [b for b in self.starts if b < media.block - 4]:
                del self.starts[b]
            for i in range(n):
                at = start + i * step
                self.frames.append(_Frame(at, round((at - self.origin) * VIDEO_CLOCK), media.frames[i],
                                          media.pixel_format, media.block, media if i == 0 else None))
        elif media.block in self.starts:
            samples = media.audio
            assert samples is not None  # a block placed for its audio has audio
            if media.sample_rate != AUDIO_RATE and samples.size:  # one rate per track: resample linearly
                n = round(samples.size * AUDIO_RATE / media.sample_rate)
                samples = np.interp(np.linspace(0, samples.size - 1, n), np.arange(samples.size),
                                    samples).astype(np.int16)
            start, until = self.starts[media.block]
            first = round((start - self.origin) * AUDIO_RATE)
            samples = samples[:max(0, round((until - self.origin) * AUDIO_RATE) - first)]  # none past a cut
            self.audio.append((first, samples))
        self.wake.set()

    def _cut(self, at: float) -> None:
        """Drop the queued media due from `at` on: frames, the audio of earlier blocks, blocks that start there."""
        kept = collections.deque(f for f in self.frames if f.at < at)
        self.cut_frames += len(self.frames) - len(kept)
        self.skipped_blocks += sum(f.starts is not None for f in self.frames if f.at >= at)
        self.frames = kept
        for block, span in list(self.starts.items()):
            if span[0] >= at:
                del self.starts[block]  # its audio, still to come, is not played either
            else:
                span[1] = min(span[1], at)
        limit = round((at - self.origin) * AUDIO_RATE) if self.origin is not None else 0
        self.audio = collections.deque((first, samples[:max(0, limit - first)])
                                       for first, samples in self.audio if first < limit)
        self.end = at

    async def next_frame(self) -> _Frame:
        """The next frame, at its time; frames whose time passed by LATE_DROP_S are skipped."""
        while True:
            while not self.frames:
                if self.closed:
                    raise MediaStreamError
                self.wake.clear()
                await self.wake.wait()
            frame = self.frames[0]
            delay = frame.at - self.clock()
            if delay > 0:
                self.wake.clear()
                try:
                    await asyncio.wait_for(self.wake.wait(), delay)  # woken early: the timeline may have restarted
                except TimeoutError:
                    pass
                continue
            self.frames.popleft()
            if frame.starts is not None:  # announced even if its first frame is skipped: the rest still play
                self.on_block_start(frame.starts, frame.pts)
            if -delay > LATE_DROP_S and self.frames:
                self.late_frames += 1
                continue
            if self.first_pts is None:
                self.first_pts = frame.pts
            return frame

    def audio_at(self, first: int, n: int) -> np.ndarray:
        """Samples [first, first + n): the placed audio where there is some, silence elsewhere."""
        out = np.zeros(n, dtype=np.int16)
        while self.audio and self.audio[0][0] + self.audio[0][1].size <= first:
            self.audio.popleft()
        for start, samples in self.audio:
            if start >= first + n:
                break
            lo, hi = max(start, first), min(start + samples.size, first + n)
            if lo < hi:
                out[lo - first:hi - first] = samples[lo - start:hi - start]
        return out

    def close(self) -> None:
        self.closed = True
        self.wake.set()


class BlockVideoTrack(MediaStreamTrack):
    kind = "video"

    def __init__(self, playout: Playout) -> None:
        super().__init__()
        self.playout = playout

    async def recv(self) -> av.VideoFrame:
        frame = await self.playout.next_frame()
        out = av.VideoFrame.from_ndarray(frame.image, format=frame.pixel_format)  # a copy: this viewer's pts
        out.pts, out.time_base = frame.pts, fractions.Fraction(1, VIDEO_CLOCK)
        return out


class BlockAudioTrack(MediaStreamTrack):
    kind = "audio"

    def __init__(self, playout: Playout) -> None:
        super().__init__()
        self.playout = playout
        self.sample = 0  # the next frame's first sample, counted from the playout's origin

    async def recv(self) -> av.AudioFrame:
        p = self.playout
        while p.origin is None:  # nothing placed yet: no timeline to play
            if p.closed:
                raise MediaStreamError
            p.wake.clear()
            await p.wake.wait()
        delay = p.origin + self.sample / AUDIO_RATE - p.clock()
        if delay > 0:
            await asyncio.sleep(delay)
        elif -delay > LATE_DROP_S:  # the loop stalled: skip ahead rather than play a backlog late
            self.sample = round((p.clock() - p.origin) * AUDIO_RATE)
        if p.closed:
            raise MediaStreamError
        samples = p.audio_at(self.sample, AUDIO_FRAME)
        p.levels.append((self.sample, audio_level(samples)))
        out = av.AudioFrame.from_ndarray(samples.reshape(1, -1), format="s16", layout="mono")
        out.sample_rate, out.pts, out.time_base = AUDIO_RATE, self.sample, fractions.Fraction(1, AUDIO_RATE)
        self.sample += AUDIO_FRAME
        return out


def audio_level(samples: np.ndarray) -> int:
    """The frame's level as aiortc's sender puts it in each packet's RFC 6464 header extension (-dBov,
    0 loudest to 127 silent): a viewer that sees the levels played (getSynchronizationSources) finds by
    them which sample each audio RTP timestamp carries, which the RTP timestamps alone do not tell."""
    rms = float(np.sqrt(np.mean(samples.astype(np.float64) ** 2))) / 32767 if samples.size else 0.0
    return -round(min(0.0, max(-127.0, 20 * math.log10(rms)))) if rms > 0 else 127
