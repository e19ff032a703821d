"""Optional lossless wire codec: zstd or lz4, with bf16/fp16 split into byte planes first.

Splitting 2-byte floats into a high-byte plane and a low-byte plane puts the
sign/exponent bytes together, which compress far better than interleaved.
CRCs and receipts bind to the decoded bytes, never to the wire bytes.
"""

from __future__ import annotations

import lz4.block
import numpy as np
import zstandard

from libs.errors import IntegrityError

_ZSTD_LEVEL = 1  # the fastest level: a codec that is slower than the wire only adds time


def encode(codec: str, data: np.ndarray, planes: int) -> bytes:
    raw = _split(data, planes) if planes > 1 else data
    if codec == "zstd":
        return zstandard.ZstdCompressor(level=_ZSTD_LEVEL).compress(raw)
    if codec == "lz4":
        return lz4.block.compress(raw, store_size=False)
    raise ValueError(f"unknown codec {codec}")


def decode_into(codec: str, wire: memoryview, out: np.ndarray, planes: int) -> None:
    """Decode `wire` into `out` (exactly out.nbytes bytes) or raise IntegrityError."""
    n = out.nbytes
    try:
        if codec == "zstd":
            raw = zstandard.ZstdDecompressor().decompress(wire, max_output_size=n)
        elif codec == "lz4":
            raw = lz4.block.decompress(wire, uncompressed_size=n)
        else:
            raise IntegrityError(f"unknown codec {codec}")
    except (zstandard.ZstdError, lz4.block.LZ4BlockError) as e:
        raise IntegrityError(f"{codec} payload does not decode: {e}") from None
    if len(raw) != n:
        raise IntegrityError(f"{codec} payload decoded to {len(raw)} bytes, expected {n}")
    arr = np.frombuffer(raw, dtype=np.uint8)
    if planes > 1 and n % planes == 0:
        out[:] = arr.reshape(planes, -1).T.reshape(-1)
    else:
        out[:] = arr


def _split(data: np.ndarray, planes: int) -> np.ndarray:
    if data.nbytes % planes:
        return data
    return np.ascontiguousarray(data.reshape(-1, planes).T)


def planes_for(itemsize: int, byte_planes: bool) -> int:
    return itemsize if byte_planes and itemsize == 2 else 1
