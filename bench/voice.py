"""N concurrent talking-head sessions on a real `statefleet up` stack, each fed real-time speech-like
audio (24 kHz, as a TTS makes it) by an `AvatarStream` client, then a SIGKILL of one session's owner.

    python -m bench.voice [--quick] --json PATH

Each session speaks `utterances` utterances (end_segment after each, waiting for segment_done), one
of them cut by a clear half-way. Measured at the client (its monotonic clock):
- audio_to_frame_ms: an utterance's first sample posted (the ring empty: nothing ahead of it) to the
  arrival of the block whose frames its audio drives (later samples wait behind earlier ones by
  design: that is playback, not latency);
- clear_ms: clear posted to the last block seen that still played audio from before it;
- av_skew_ms: within a block, the arrival of its audio vs its frames;
- underruns: blocks that arrived after their playout slot (a jitter buffer of one block period,
  the clock started at the first block of the utterance);
- lost_audio_ms / repeated_audio_ms: the audio out against the audio in (every utterance whole,
  the cleared one up to its `segment_played`), across the SIGKILL too.
Baseline (same run): the same first-sample latency with one session alone, before the others start.
Targets: audio-to-frame p95 <= 2 periods + 50 ms; clear p95 <= 1 period + 50 ms; skew p95 <= 20 ms;
0 lost, 0 repeated.
"""

from __future__ import annotations

import asyncio
import os
import signal
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import numpy as np

from bench.common import parser, percentile, table, write
from bench.stack import UpStack
from bench.voice_path import BusWatch, FirstSample, engine_split, first_sample, legs
from libs import bus
from libs.audio_resample import Resampler
from statefleet.client import AvatarBlock, AvatarStream

PERIOD_MS = 160.0  # talking_head's media per block: 4 frames at 25 fps
RATE_IN = 24000


def speech(seconds: float, seed: int) -> np.ndarray:
    """int16 at RATE_IN: a voiced tone with a syllable envelope, pitch from the seed."""
    t = np.arange(int(seconds * RATE_IN)) / RATE_IN
    env = 0.5 - 0.5 * np.cos(2 * np.pi * 4.0 * t)
    return (0.5 * env * np.sin(2 * np.pi * (150 + 10 * seed) * t) * 32767).astype(np.int16)


@dataclass
class Session:
    stream: AvatarStream
    index: int
    sid: str = ""
    watch: BusWatch = field(default_factory=BusWatch)
    path: list[FirstSample] = field(default_factory=list)  # where each first sample's ms went
    blocks: list[AvatarBlock] = field(default_factory=list)
    expected: list[np.ndarray] = field(default_factory=list)  # what should have played, utterance by utterance
    first_sample: list[float] = field(default_factory=list)  # audio_to_frame samples, ms
    clears: list[float] = field(default_factory=list)
    underruns: int = 0
    reader: asyncio.Task | None = None
    _arrived: asyncio.Event = field(default_factory=asyncio.Event)

    async def read(self) -> None:
        async for b in self.stream:
            self.blocks.append(b)
            self._arrived.set()

    async def wait(self, pred, timeout_s: float = 120.0):
        deadline = time.monotonic() + timeout_s
        while (found := pred()) is None:
            self._arrived.clear()
            await asyncio.wait_for(self._arrived.wait(), max(0.01, deadline - time.monotonic()))
        return found

    def event(self, kind: str, seq: int):
        return lambda: next((b for b in self.blocks for e in b.events if (e.event, e.seq) == (kind, seq)), None)

    def played(self) -> int:
        return sum(b.audio.shape[0] for b in self.blocks)

    async def utterance(self, seconds: float, *, clear_at: float | None = None, on_playing=None) -> None:
        pcm = speech(seconds, self.index)
        want = Resampler(RATE_IN, 16000).feed(pcm)
        start_block, start_played = len(self.blocks), self.played()
        posted = time.monotonic()
        pushing = asyncio.create_task(self.stream.push_audio(pcm, RATE_IN))
        first = await self.wait(lambda: next((b for b in self.blocks[start_block:] if b.audio.shape[0]), None))
        self.first_sample.append((first.received_at - posted) * 1000)
        if (leg := first_sample(self.stream, posted, first, self.watch)) is not None:
            self.path.append(leg)
        if on_playing is not None:
            await on_playing(self)
        if clear_at is not None:
            await self.wait(lambda: True if self.played() - start_played >= clear_at * 16000 else None)
            sent = time.monotonic()
            seq = await self.stream.clear("bench")
            await pushing
            done = await self.wait(self.event("cleared", seq))
            cleared = next(e for e in done.events if e.event == "cleared")
            stale = [b for b in self.blocks[start_block:] if b.block < done.block and b.audio.shape[0]
                     and b.received_at >= sent]
            self.clears.append(((stale[-1].received_at - sent) * 1000) if stale else 0.0)
            self.expected.append(want[: cleared.segment_played])
        else:
            await pushing
            seq = await self.stream.end_segment()
            done = await self.wait(self.event("segment_done", seq), timeout_s=180)
            self.expected.append(want)
        self._count_underruns(self.blocks[start_block:self.blocks.index(done) + 1])

    def _count_underruns(self, blocks: list[AvatarBlock]) -> None:
        playing = [b for b in blocks if b.audio.shape[0]]
        if not playing:
            return
        t0, k0 = playing[0].received_at, playing[0].block
        self.underruns += sum(1 for b in playing if b.received_at > t0 + (b.block - k0 + 1) * PERIOD_MS / 1000)

    def audio_error_ms(self) -> tuple[float, float]:
        out = np.concatenate([b.audio for b in self.blocks]) if self.blocks else np.zeros(0, np.int16)
        want = np.concatenate(self.expected) if self.expected else np.zeros(0, np.int16)
        n = min(out.shape[0], want.shape[0])
        same = int(np.argmax(out[:n] != want[:n])) if (out[:n] != want[:n]).any() else n
        lost = (want.shape[0] - same) / 16.0
        repeated = (out.shape[0] - same) / 16.0
        return lost, repeated


async def create(http: aiohttp.ClientSession, url: str, seed: int) -> dict:
    body = {"v": 1, "backend": "talking_head", "seed": seed, "prompt": "presenter",
            "contract": {"session_class": "C1", "quality_floor": 1, "determinism": "T0", "period_ms": PERIOD_MS}}
    async with http.post(f"{url}/v1/sessions", json=body) as r:
        created = await r.json(content_type=None)
        if r.status != 201:
            raise RuntimeError(f"session not admitted: {r.status} {created}")
        return created


async def open_session(http, nc, stack: UpStack, i: int) -> Session:
    created = await create(http, stack.admission_url, i + 1)
    s = Session(await AvatarStream.open(created), i, created["session_id"])
    await s.watch.start(nc, s.sid)
    s.reader = asyncio.create_task(s.read())
    return s


async def run(args) -> dict:
    n, utterances = (2, 2) if args.quick else (4, 3)
    with tempfile.TemporaryDirectory(prefix="bench-voice-") as tmp:
        # A kept dir is the run's own: a stack started on an earlier run's NATS data would recover that
        # run's sessions (admission and placement do) and serve them beside ours.
        kept = Path(args.json).parent / f"bench-voice-stack-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
        data_dir = kept if args.keep else Path(tmp)
        stack = UpStack(data_dir, engines=2).start()
        try:
            await stack.ready(timeout_s=600)  # engine hosts profile every backend at start: minutes under load
            nc = await bus.connect(stack.cli_url(), name="bench-voice")
            async with aiohttp.ClientSession(headers=stack.admin_headers()) as http:
                alone = await open_session(http, nc, stack, 0)
                for _ in range(3):
                    await alone.utterance(1.0)
                sessions = [alone] + [await open_session(http, nc, stack, i) for i in range(1, n)]
                base, base_path = list(alone.first_sample), list(alone.path)
                alone.first_sample.clear()
                alone.path.clear()

                async def speak(s: Session) -> None:
                    for u in range(utterances):
                        await s.utterance(2.0, clear_at=1.0 if u == 1 else None)
                        await asyncio.sleep(0.2 * (s.index + 1))  # sessions out of step

                await asyncio.gather(*(speak(s) for s in sessions))
                steady_underruns = sum(s.underruns for s in sessions)
                split = await engine_split(nc, stack.host_ids, {s.sid for s in sessions})

                async def kill_owner(s: Session) -> None:
                    await asyncio.sleep(1.0)
                    host = s.stream.owner["server_id"]
                    stack.signal(host, signal.SIGKILL)
                    killed.append(host)

                killed: list[str] = []
                failover_error = ""
                try:
                    await sessions[0].utterance(6.0, on_playing=kill_owner)
                except TimeoutError:  # recorded, with what the client saw, instead of losing the run
                    s0 = sessions[0]
                    failover_error = (f"no segment_done after the kill: owner {s0.stream.owner}, next block "
                                      f"{s0.stream.assembler.next_block}, {len(s0.blocks)} blocks, "
                                      f"{s0.stream.resends} resends; logs in {data_dir}")
            errors = [s.audio_error_ms() for s in sessions]
            first = [x for s in sessions for x in s.first_sample]
            clears = [x for s in sessions for x in s.clears]
            skew = [abs(b.audio_at - b.frames_at) * 1000 for s in sessions for b in s.blocks]
            for s in sessions:
                await s.stream.close()
            await nc.close()
        finally:
            stack.stop()
    a2f95 = percentile(first, 95)
    return {
        "sessions": n, "utterances_per_session": utterances, "period_ms": PERIOD_MS, "killed": killed,
        "failover_error": failover_error,
        "audio_to_frame_ms_p50": percentile(first, 50), "audio_to_frame_ms_p95": a2f95,
        "audio_to_frame_ms_p95_alone": percentile(base, 95),
        "audio_to_frame_ratio_vs_alone": a2f95 / max(1e-9, percentile(base, 95)),
        "clear_ms_p95": percentile(clears, 95), "av_skew_ms_p95": percentile(skew, 95),
        "underruns": steady_underruns, "underruns_with_failover": sum(s.underruns for s in sessions) - steady_underruns,
        "audio_to_frame_path": {"concurrent": legs([x for s in sessions for x in s.path]),
                                "alone": legs(base_path), "engine": split,
                                "grid_wait_floor_ms_p50": PERIOD_MS / 2, "grid_wait_floor_ms_p95": 0.95 * PERIOD_MS},
        "lost_audio_ms": sum(e[0] for e in errors), "repeated_audio_ms": sum(e[1] for e in errors),
        "targets": {"audio_to_frame_ms_p95": 2 * PERIOD_MS + 50, "clear_ms_p95": PERIOD_MS + 50,
                    "av_skew_ms_p95": 20.0, "lost_audio_ms": 0, "repeated_audio_ms": 0},
    }


def main() -> None:
    p = parser("voice", __doc__.splitlines()[0])
    p.add_argument("--keep", action="store_true", help="keep the stack's data dir and logs next to the JSON")
    args = p.parse_args()
    result = asyncio.run(run(args))
    t = result["targets"]
    table([(k, result[k], f"target <= {t[k]}" if k in t else "") for k in
           ("audio_to_frame_ms_p50", "audio_to_frame_ms_p95", "audio_to_frame_ms_p95_alone", "clear_ms_p95",
            "av_skew_ms_p95", "underruns", "underruns_with_failover", "lost_audio_ms", "repeated_audio_ms")])
    path = result["audio_to_frame_path"]
    table([(f"{part}.{k}", v, "") for part in ("concurrent", "alone", "engine") for k, v in path[part].items()
           if k != "taken_at"])
    write(args.json, result)


if __name__ == "__main__":
    main()
