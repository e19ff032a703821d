"""A block's output as `OutputChunk` messages, each under the NATS payload limit."""

from __future__ import annotations

import torch

from libs.schemas.engine import OutputChunk
from services.engine_host.backends import Output

MAX_CHUNK_BYTES = 512 * 1024  # NATS' default max_payload is 1 MiB; leave room for the envelope


def chunks(session_id: str, block: int, out: Output, max_bytes: int = MAX_CHUNK_BYTES, *,
           replayed: bool = False) -> list[OutputChunk]:
    parts: list[OutputChunk] = []
    for kind, t in (("frames", out.frames), ("audio", out.audio)):
        if t is None:
            continue
        raw = t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        n = max(1, -(-len(raw) // max_bytes))
        parts += [OutputChunk(session_id=session_id, block=block, kind=kind, dtype=str(t.dtype).removeprefix("torch."),
                              shape=list(t.shape), part=i, parts=n, data=raw[i * max_bytes:(i + 1) * max_bytes],
                              replayed=replayed)
                  for i in range(n)]
    return parts


def assemble(parts: list[OutputChunk]) -> torch.Tensor:
    """The tensor the parts of one (block, kind) carry, in part order."""
    parts = sorted(parts, key=lambda c: c.part)
    if [c.part for c in parts] != list(range(parts[0].parts)):
        raise ValueError("missing or repeated output parts")
    raw = bytearray(b"".join(c.data for c in parts))
    return torch.frombuffer(raw, dtype=getattr(torch, parts[0].dtype)).reshape(parts[0].shape)
