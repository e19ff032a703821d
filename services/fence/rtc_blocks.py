"""A session's output chunks (`sf.output.<sid>`) put back together into media for one WebRTC viewer.

The invariant a viewer sees: each block index is played at most once, in rising order. A block at or
below the last one played (a replay after a move or failover, a resend) is dropped and counted, so
the tracks never repeat media; a block overtaken by a later one before it completed is given up.

Frames and audio of a block complete separately (the engine publishes the frames first): each part
is handed on as soon as it is whole, frames in the pixel format the VP8 encoder takes (yuv420p planes
[H * 3/2, W]; RGB [H, W, 3] where a side is odd, which only the encoder can convert), audio as int16
samples with the rate its block implies (samples / media_s). Decoding (PNG) and the conversion run in
a worker thread, not on the loop, once per session for all its viewers (rtc_feed.py): the encoder
would otherwise convert every frame again for each viewer, with a new converter each time.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import av
import numpy as np
from av.video.reformatter import VideoReformatter

from libs import png
from libs.schemas.engine import OutputChunk

MAX_OPEN_BLOCKS = 8  # blocks being assembled at once; beyond it the oldest is given up


@dataclass(slots=True)
class BlockMedia:
    """One block's part of a kind, decoded: frames [F, ...] uint8 in `pixel_format`, or audio [samples] int16."""

    block: int
    kind: str  # "frames" | "audio"
    media_s: float
    input_seq: int
    frames: np.ndarray | None = None
    pixel_format: str = "rgb24"  # of each frame: "yuv420p" [H * 3/2, W] or "rgb24" [H, W, 3]
    audio: np.ndarray | None = None
    sample_rate: int = 0
    arrived_at: float = 0.0  # time.time() the block's first frame chunk came


@dataclass(slots=True)
class _Open:
    parts: dict[str, dict[int, OutputChunk]] = field(default_factory=lambda: {"frames": {}, "audio": {}})
    done: set[str] = field(default_factory=set)
    arrived_at: float = 0.0


OnMedia = Callable[[BlockMedia], Awaitable[None]]


class BlockAssembler:
    """Chunks in, decoded block media out (in block order, each block once)."""

    def __init__(self, on_media: OnMedia) -> None:
        self.on_media = on_media
        self.last_started = 0  # highest block whose frames were handed on: nothing at or below it plays again
        self.replays_dropped = 0  # blocks that came again after they were played (counted once per block)
        self.undecodable = 0
        self._open: dict[int, _Open] = {}
        self._counted: set[int] = set()
        self._lock = asyncio.Lock()  # hands blocks on one at a time, in order
        self._converter = VideoReformatter()  # used by one decode at a time (under the lock)

    async def add(self, chunk: OutputChunk) -> None:
        if chunk.kind not in ("frames", "audio") or chunk.parts < 1 or not 0 <= chunk.part < chunk.parts:
            return
        if chunk.block <= self.last_started and chunk.block not in self._open:
            if chunk.kind == "frames" and chunk.block not in self._counted:
                self._counted.add(chunk.block)
                self._counted = {b for b in self._counted if b > self.last_started - 64}
                self.replays_dropped += 1
            return
        block = self._open.setdefault(chunk.block, _Open())
        if chunk.kind in block.done:
            return
        if chunk.kind == "frames" and not block.arrived_at:
            block.arrived_at = time.time()
        parts = block.parts[chunk.kind]
        parts[chunk.part] = chunk
        if len(parts) < chunk.parts:
            self._trim()
            return
        block.done.add(chunk.kind)
        ordered = [parts[i] for i in range(chunk.parts)]
        parts.clear()
        async with self._lock:
            if chunk.kind == "frames":
                if chunk.block <= self.last_started:  # a later block started meanwhile: too late to play
                    self._open.pop(chunk.block, None)
                    return
                self.last_started = chunk.block
                for b in [b for b in self._open if b < chunk.block]:  # overtaken: never completes in time
                    del self._open[b]
            try:
                media = await asyncio.to_thread(_decode, ordered, self._converter)
                media.arrived_at = block.arrived_at
            except ValueError:
                self.undecodable += 1
                media = None
            if block.done == {"frames", "audio"} or (chunk.kind == "audio" and "frames" in block.done):
                self._open.pop(chunk.block, None)
            if media is not None:
                await self.on_media(media)

    def _trim(self) -> None:
        while len(self._open) > MAX_OPEN_BLOCKS:
            del self._open[min(self._open)]


def _decode(parts: list[OutputChunk], converter: VideoReformatter) -> BlockMedia:
    first = parts[0]
    out = BlockMedia(block=first.block, kind=first.kind, media_s=first.media_s, input_seq=first.input_seq)
    if first.kind == "frames":
        want = first.shape  # [F, 3, H, W]
        if len(want) != 4 or want[1] != 3:
            raise ValueError(f"frames of shape {want} are not [F, 3, H, W]")
        if first.encoding == "png":
            rgb = np.stack([png.decode_hwc(p.data) for p in parts])  # [F, H, W, 3]: no transposing copies
        else:
            rgb = np.ascontiguousarray(_raw(parts, np.uint8).transpose(0, 2, 3, 1))
        if list(rgb.shape) != [want[0], want[2], want[3], 3]:
            raise ValueError(f"frames are {list(rgb.shape[:3])} [F, H, W], the chunk says {want} [F, 3, H, W]")
        if rgb.shape[1] % 2 or rgb.shape[2] % 2:  # PyAV's yuv420p arrays need even sides: the encoder converts these
            out.frames = rgb
        else:
            out.frames = np.stack([converter.reformat(av.VideoFrame.from_ndarray(f, format="rgb24"),
                                                      format="yuv420p").to_ndarray() for f in rgb])
            out.pixel_format = "yuv420p"
    else:
        if first.dtype != "int16":
            raise ValueError(f"audio of dtype {first.dtype} is not played")
        out.audio = _raw(parts, np.int16).reshape(-1)
        out.sample_rate = round(out.audio.size / first.media_s) if first.media_s > 0 else 16000
    return out


def _raw(parts: list[OutputChunk], dtype) -> np.ndarray:
    data = b"".join(p.data for p in parts)
    if len(data) % np.dtype(dtype).itemsize:
        raise ValueError("raw output of a size that is no whole number of items")
    arr = np.frombuffer(data, dtype=dtype)
    shape = parts[0].shape
    if int(np.prod(shape)) != arr.size:
        raise ValueError(f"raw output of {arr.size} items, the chunk says {shape}")
    return arr.reshape(shape)
