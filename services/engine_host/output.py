"""A block's output as `OutputChunk` messages, each under the NATS payload limit.

`encode` is the heavy half (PNG per frame) and runs in a worker thread of the sink;
`chunks` only wraps its bytes, so nothing compresses on the event loop.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from libs import png
from libs.schemas.engine import OutputChunk
from services.engine_host.backends import Output

MAX_CHUNK_BYTES = 512 * 1024  # NATS' default max_payload is 1 MiB; leave room for the envelope


@dataclass(frozen=True)
class Encoded:
    """One tensor of a block, cut into the payloads of its parts."""

    kind: str
    dtype: str
    shape: list[int]
    encoding: str
    parts: list[bytes]


def encode(out: Output, max_bytes: int = MAX_CHUNK_BYTES) -> list[Encoded]:
    """Frames as one PNG each (raw slices if a frame's PNG would not fit a chunk); audio as raw slices.
    Events go first, so a reader that has a block's frames and audio has its events too."""
    encoded = [Encoded("event", "json", [len(out.events)], "raw", list(out.events))] if out.events else []
    for kind, t in (("frames", out.frames), ("audio", out.audio)):
        if t is None:
            continue
        t = t.cpu()  # a backend may decode on its device (the decode stage synchronises for it); PNG is host work
        dtype, shape = str(t.dtype).removeprefix("torch."), list(t.shape)
        if kind == "frames" and t.dtype == torch.uint8 and t.dim() == 4 and t.shape[1] == 3:
            pngs = [png.encode(frame) for frame in t.numpy()]
            if all(len(p) <= max_bytes for p in pngs):
                encoded.append(Encoded(kind, dtype, shape, "png", pngs))
                continue
        raw = t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        n = max(1, -(-len(raw) // max_bytes))
        encoded.append(Encoded(kind, dtype, shape, "raw", [raw[i * max_bytes:(i + 1) * max_bytes] for i in range(n)]))
    return encoded


def chunks(session_id: str, block: int, encoded: list[Encoded], *, media_s: float = 0.0,
           input_seq: int = 0, replayed: bool = False) -> list[OutputChunk]:
    return [OutputChunk(session_id=session_id, block=block, kind=e.kind, dtype=e.dtype, shape=e.shape, part=i,
                        parts=len(e.parts), data=data, encoding=e.encoding, media_s=media_s, input_seq=input_seq,
                        replayed=replayed)
            for e in encoded for i, data in enumerate(e.parts)]


def assemble(parts: list[OutputChunk]) -> torch.Tensor:
    """The tensor the parts of one (block, kind) carry, in part order."""
    parts = sorted(parts, key=lambda c: c.part)
    if [c.part for c in parts] != list(range(parts[0].parts)):
        raise ValueError("missing or repeated output parts")
    if parts[0].encoding == "png":
        frames = torch.stack([torch.from_numpy(png.decode(c.data)) for c in parts])
        if list(frames.shape) != parts[0].shape:
            raise ValueError(f"PNG frames are {list(frames.shape)}, the chunk says {parts[0].shape}")
        return frames
    raw = bytearray(b"".join(c.data for c in parts))
    return torch.frombuffer(raw, dtype=getattr(torch, parts[0].dtype)).reshape(parts[0].shape)
