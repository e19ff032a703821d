"""CRC32C over tensor memory, chunked, off the event loop, with CRC combination.

The `crc32c` package releases the GIL and reads any buffer zero-copy, so chunks
of one state are checksummed in parallel on worker threads. `combine` joins the
CRCs of adjacent byte ranges (zlib's GF(2) operator method for the Castagnoli
polynomial), so a leaf's CRC comes from its chunks' CRCs without a second pass.
"""

from __future__ import annotations

import functools
from concurrent.futures import ThreadPoolExecutor

import crc32c as _crc
import torch

_POLY = 0x82F63B78  # CRC32C, reflected
_HOST_STAGE_BYTES = 8 << 20  # device tensors are checksummed through host buffers of this size

pool = ThreadPoolExecutor(max_workers=max(2, min(8, torch.get_num_threads())), thread_name_prefix="sf-crc")


def crc(buf, value: int = 0) -> int:
    return _crc.crc32c(buf, value)


def byte_view(t: torch.Tensor) -> torch.Tensor:
    """The tensor's memory as a flat uint8 tensor (no copy for contiguous tensors)."""
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def crc_bytes(flat: torch.Tensor, value: int = 0) -> int:
    """CRC32C of a flat uint8 tensor on any device (device memory is staged through host)."""
    if flat.device.type == "cpu":
        return crc(flat.numpy(), value)
    for start in range(0, flat.numel(), _HOST_STAGE_BYTES):
        value = crc(flat[start:start + _HOST_STAGE_BYTES].cpu().numpy(), value)
    return value


def _gf2_times(mat: tuple[int, ...], vec: int) -> int:
    out, i = 0, 0
    while vec:
        if vec & 1:
            out ^= mat[i]
        vec >>= 1
        i += 1
    return out


def _compose(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    """The operator a∘b (apply b, then a)."""
    return tuple(_gf2_times(a, b[n]) for n in range(32))


@functools.cache
def _zeros_op(nbytes: int) -> tuple[int, ...]:
    """The operator that advances a CRC register over `nbytes` zero bytes."""
    one_bit = (_POLY, *(1 << n for n in range(31)))
    op = one_bit
    for _ in range(3):  # 1 bit -> 8 bits
        op = _compose(op, op)
    result = tuple(1 << n for n in range(32))
    n = nbytes
    while n:
        if n & 1:
            result = _compose(op, result)
        op = _compose(op, op)
        n >>= 1
    return result


def combine(crc_a: int, crc_b: int, len_b: int) -> int:
    """CRC32C of A‖B from CRC(A), CRC(B) and len(B)."""
    if len_b == 0:
        return crc_a
    return _gf2_times(_zeros_op(len_b), crc_a) ^ crc_b


def combine_all(crcs: list[int], lengths: list[int]) -> int:
    value = 0
    for c, n in zip(crcs, lengths, strict=True):
        value = combine(value, c, n)
    return value
