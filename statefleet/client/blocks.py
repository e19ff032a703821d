"""Reassembling a session's output stream into whole blocks, each delivered once and in order.

The output socket carries a block's chunks (frames, audio, events) as the engine published them.
Across an owner change the new owner regenerates blocks the old one may have shown (marked
`replayed`), and the old one may have published only part of its last block. So: parts are kept
by (block, kind, part), the first copy of each wins (a T0 session regenerates the same bytes); a
block is whole once its frames and audio are; blocks go out strictly in index order, each once;
an event goes out once per (event, item seq). A block that never completes (a chunk the bus lost)
is skipped once a later block has been whole for `gap_s`, and counted.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec
import numpy as np

from libs import png
from libs.schemas.engine import OutputChunk
from libs.schemas.voice import VoiceEvent

_event = msgspec.json.Decoder(VoiceEvent)


@dataclass
class AvatarBlock:
    """One block of the avatar: `frames` uint8 [F, 3, H, W], `audio` int16 at 16 kHz starting with frame 0
    (shorter than the block when the ring ran dry: silence after it), and the events it answered."""

    block: int
    frames: np.ndarray
    audio: np.ndarray
    media_s: float
    events: list[VoiceEvent] = field(default_factory=list)
    input_seq: int = 0
    received_at: float = 0.0  # when its last chunk arrived (the client's monotonic clock)
    frames_at: float = 0.0
    audio_at: float = 0.0


@dataclass
class _Partial:
    parts: dict[tuple[str, int], OutputChunk] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    whole_at: float = 0.0
    arrived: dict[str, float] = field(default_factory=dict)

    def add(self, c: OutputChunk, now: float) -> None:
        self.parts.setdefault((c.kind, c.part), c)
        self.counts[c.kind] = c.parts
        if sum(1 for k, _ in self.parts if k == c.kind) == c.parts:
            self.arrived.setdefault(c.kind, now)

    def whole(self) -> bool:
        return all(sum(1 for k, _ in self.parts if k == kind) == self.counts.get(kind, -1)
                   for kind in ("frames", "audio"))


class BlockAssembler:
    def __init__(self, *, gap_s: float = 2.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.gap_s, self.clock = gap_s, clock
        self.next_block: int | None = None  # the next index to deliver
        self.first_block: int | None = None  # the first one delivered
        self.skipped = 0
        self.repeated_chunks = 0  # chunks of blocks already delivered (a replacement's regenerations)
        self._partial: dict[int, _Partial] = {}
        self._events_seen: set[tuple[str, int]] = set()

    def add(self, chunk: OutputChunk) -> list[AvatarBlock]:
        """Take one chunk; returns the blocks now deliverable, in order."""
        if chunk.kind not in ("frames", "audio", "event"):
            return []
        if self.next_block is not None and chunk.block < self.next_block:
            self.repeated_chunks += 1
            return []
        now = self.clock()
        p = self._partial.setdefault(chunk.block, _Partial())
        p.add(chunk, now)
        if p.whole() and not p.whole_at:
            p.whole_at = now
        return self._ready(now)

    def _ready(self, now: float) -> list[AvatarBlock]:
        out = []
        while self._partial:
            if self.next_block is None:
                self.next_block = self.first_block = min(self._partial)  # joined mid-stream: the first seen
            p = self._partial.get(self.next_block)
            if p is not None and p.whole_at:
                out.append(self._build(self.next_block, self._partial.pop(self.next_block)))
                self.next_block += 1
                continue
            later = [b for b, q in self._partial.items() if b > self.next_block and q.whole_at]
            if later and now - min(self._partial[b].whole_at for b in later) >= self.gap_s:
                self._partial.pop(self.next_block, None)
                self.skipped += 1
                self.next_block += 1
                continue
            break
        return out

    def _build(self, block: int, p: _Partial) -> AvatarBlock:
        frames = [p.parts[("frames", i)] for i in range(p.counts["frames"])]
        audio = [p.parts[("audio", i)] for i in range(p.counts["audio"])]
        if frames[0].encoding == "png":
            video = np.stack([png.decode(c.data) for c in frames])
        else:
            video = np.frombuffer(b"".join(c.data for c in frames), dtype=np.uint8).reshape(frames[0].shape)
        pcm = np.frombuffer(b"".join(c.data for c in audio), dtype="<i2").copy()
        events = []
        for i in range(p.counts.get("event", 0)):
            c = p.parts.get(("event", i))
            if c is None:
                continue
            e = _event.decode(c.data)
            if (e.event, e.seq) not in self._events_seen:
                self._events_seen.add((e.event, e.seq))
                events.append(e)
        return AvatarBlock(block=block, frames=video, audio=pcm, media_s=frames[0].media_s, events=events,
                           input_seq=frames[0].input_seq, received_at=max(p.arrived.values()),
                           frames_at=p.arrived.get("frames", 0.0), audio_at=p.arrived.get("audio", 0.0))
