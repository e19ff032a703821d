"""Staging a chunk and checking it: the bytes in the slot must match the CRC the sender gave.

Every receive path ends here, whatever carried the bytes: a chunk counts as
staged only once a CRC taken over the slot's own memory equals the chunk's
CRC, and only then is that CRC recorded for the slot's digest and `verify`.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import torch

from libs.errors import IntegrityError
from libs.motion import checksum, cma, crc

_PIECE_BYTES = 256 << 10  # copy and checksum host chunks in pieces that stay in the core's L2 cache
# A kernel copy pays a fixed cost per call (pinning the source pages): 1 MiB pieces, still L2-sized on
# this VM, ran 90 Gb/s copy+CRC against 77 for 256 KiB (bench.mover's pull, 2026-12-01).
_PULL_PIECE_BYTES = 1 << 20


class Staging(Protocol):
    """What a checked copy needs of a slot (`ShadowSlot` has it)."""

    checksum: str

    def region(self, leaf: int, offset: int, length: int) -> torch.Tensor: ...

    def record(self, leaf: int, offset: int, staged_crc: int) -> None: ...


def copy_checked(dst: torch.Tensor, src: torch.Tensor, src_crc: int | None = None) -> tuple[int, int]:
    """Copy flat uint8 `src` into `dst`; returns (CRC of the source bytes, CRC of the staged bytes).

    On host memory the copy runs in L2-sized pieces: CRC the source piece (`src_crc=None`), copy it,
    CRC the staged piece, each running CRC carried on through the next piece. The copy and the staged
    CRC then read from cache instead of memory, and both CRCs still cover every byte on each side."""
    if src.device.type != "cpu" or dst.device.type != "cpu":
        value = crc.crc_bytes(src) if src_crc is None else src_crc
        dst.copy_(src)
        return value, crc.crc_bytes(dst)
    s, d = src.numpy(), dst.numpy()
    sv, dv = 0, 0
    for start in range(0, s.size, _PIECE_BYTES):
        sp, dp = s[start:start + _PIECE_BYTES], d[start:start + _PIECE_BYTES]
        if src_crc is None:
            sv = crc.crc(sp, sv)
        dp[:] = sp
        dv = crc.crc(dp, dv)
    return (sv if src_crc is None else src_crc), dv


def copy_and_check(slot: Staging, leaf: int, offset: int, data: torch.Tensor, chunk_crc: int | None = None) -> int:
    """Write a chunk into the slot (in a worker thread) and checksum the staged bytes while they are in
    cache; they must match `chunk_crc` (given by the sender, or else taken from `data` piece by piece
    as it is copied). Returns the source chunk's CRC."""
    region = slot.region(leaf, offset, data.numel())
    if slot.checksum == checksum.DEVHASH:  # device to device: fingerprinted on the device, both sides
        expected = checksum.of_bytes(slot.checksum, data, offset) if chunk_crc is None else chunk_crc
        region.copy_(data)
        staged = checksum.of_bytes(slot.checksum, region, offset)
    else:
        expected, staged = copy_checked(region, data, chunk_crc)
    if staged != expected:
        raise IntegrityError(f"chunk at leaf {leaf} offset {offset}: staged CRC {staged:#x} != {expected:#x}")
    slot.record(leaf, offset, staged)
    return expected


def check_staged(slot: Staging, leaf: int, offset: int, region: torch.Tensor, chunk_crc: int) -> None:
    """Bytes already written into `region` (by a socket read, a remote write or a device copy) must match
    `chunk_crc`, the frame's 32 bits of a value of the slot's checksum kind; the whole value is recorded."""
    staged = checksum.of_bytes(slot.checksum, region, offset)
    if checksum.on_wire(slot.checksum, staged) != chunk_crc:
        raise IntegrityError(f"chunk at leaf {leaf} offset {offset}: CRC {staged:#x} != {chunk_crc:#x}")
    slot.record(leaf, offset, staged)


def pull_checked(slot: Staging, leaf: int, offset: int, region: torch.Tensor, pid: int, address: int,
                   chunk_crc: int) -> None:
    """Read `region`'s bytes out of process `pid` at `address`, checksumming each staged piece while it is
    in cache; the staged CRC must equal `chunk_crc` (the sender's CRC of its own memory)."""
    d = region.numpy()
    value = 0
    for start in range(0, d.size, _PULL_PIECE_BYTES):
        piece = d[start:start + _PULL_PIECE_BYTES]
        cma.read_into(pid, address + start, piece)
        value = crc.crc(piece, value)
    if value != chunk_crc:
        raise IntegrityError(f"chunk at leaf {leaf} offset {offset}: staged CRC {value:#x} != {chunk_crc:#x}")
    slot.record(leaf, offset, value)


def copy_out(dst: torch.Tensor, src: torch.Tensor, *, bounce: bool) -> int:
    """The sender's half of a same-machine move: write flat uint8 `src` into the receiver's `dst`; returns
    the CRC of the bytes written. Frozen host memory is checksummed piece by piece just before each piece
    is copied (the copy reads from cache). `bounce` (the session is still writing `src`): each piece is
    first copied aside and the aside bytes are checksummed and written, so the CRC describes exactly
    the bytes sent. Device memory is copied first and checksummed where it landed."""
    if src.device.type != "cpu":
        dst.copy_(src)
        return crc.crc_bytes(dst)
    s, d = src.numpy(), dst.numpy()
    value = 0
    aside = np.empty(min(_PIECE_BYTES, s.size), dtype=np.uint8) if bounce else None
    for start in range(0, s.size, _PIECE_BYTES):
        piece = s[start:start + _PIECE_BYTES]
        if aside is not None:
            piece = aside[:piece.size]
            piece[:] = s[start:start + piece.size]
        value = crc.crc(piece, value)
        d[start:start + piece.size] = piece
    return value
