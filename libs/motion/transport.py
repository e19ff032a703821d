"""Transports behind one interface: a `Channel` carries one move's chunks into the destination's slot.

The sender hands a channel (leaf, offset, bytes, CRC) chunks; the channel gets
them into the destination's shadow slot, where each chunk is checksummed again
over the staged memory. No transport is trusted to say "bytes arrived": the
receiver's own CRCs, then `verify` over the whole staged copy, decide.

- in-process (same node, both hosts in this process): a tensor copy into the
  slot, device to device where both are GPUs;
- TCP (`libs.motion.tcp`): chunked, pipelined, per-chunk CRC32C, one-time token.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

import torch

from libs.errors import IntegrityError, NotFound
from libs.motion import crc
from libs.motion.slot import ShadowSlot
from libs.schemas.motion import Manifest


class Channel(Protocol):
    """One move's path into the destination slot. A channel may also offer
    `put_many(views, chunks, bounce, checksum) -> crcs` to send a whole round off the
    event loop; `send_chunks` uses it where present and `put` chunk by chunk otherwise."""

    async def put(self, leaf: int, offset: int, data: torch.Tensor, chunk_crc: int) -> None:
        """Send one chunk (a flat uint8 tensor) whose decoded bytes have CRC32C `chunk_crc`."""
        ...

    async def end_round(self) -> None: ...

    async def finish(self) -> int:
        """All chunks sent: the receiver's digest of its staged leaf CRCs (raises if it refused)."""
        ...

    async def close(self) -> None: ...


class Pipeline:
    """At most `depth` worker-thread jobs in flight; results are checked in submission order."""

    def __init__(self, depth: int = 4, pool=crc.pool) -> None:
        self.depth, self.pool = depth, pool
        self.pending: deque[asyncio.Future] = deque()

    async def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        if len(self.pending) >= self.depth:
            await self.pending.popleft()
        self.pending.append(asyncio.get_running_loop().run_in_executor(self.pool, fn, *args))

    async def drain(self) -> None:
        try:
            while self.pending:
                await self.pending.popleft()
        finally:
            self.cancel()

    def cancel(self) -> None:
        for f in self.pending:
            f.cancel()
        self.pending.clear()


_PIECE_BYTES = 256 << 10  # copy and checksum host chunks in pieces that stay in the core's L2 cache


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


def copy_and_check(slot: ShadowSlot, leaf: int, offset: int, data: torch.Tensor,
                   chunk_crc: int | None = None) -> int:
    """Write a chunk into the slot (in a worker thread) and checksum the staged bytes while they are in
    cache; they must match `chunk_crc` (given by the sender, or else taken from `data` piece by piece
    as it is copied). Returns the source chunk's CRC."""
    region = slot.region(leaf, offset, data.numel())
    expected, staged = copy_checked(region, data, chunk_crc)
    if staged != expected:
        raise IntegrityError(f"chunk at leaf {leaf} offset {offset}: staged CRC {staged:#x} != {expected:#x}")
    slot.record(leaf, offset, staged)
    return expected


# ---------------------------------------------------------------- in-process

# Data-plane addresses served by endpoints in this process: addr -> token lookup.
local_receivers: dict[str, Callable[[str], ShadowSlot]] = {}


class InProcessChannel:
    def __init__(self, slot: ShadowSlot) -> None:
        self.slot = slot
        self.pipe = Pipeline()
        self.wire_bytes = 0

    @classmethod
    def open(cls, dest_addr: str, token: str, layout: Manifest, chunk_bytes: int) -> InProcessChannel:
        lookup = local_receivers.get(dest_addr)
        if lookup is None:
            raise NotFound(f"no receiver at {dest_addr} in this process", addr=dest_addr)
        slot = lookup(token)
        slot.open(layout, chunk_bytes)
        return cls(slot)

    async def put(self, leaf: int, offset: int, data: torch.Tensor, chunk_crc: int) -> None:
        self.wire_bytes += data.numel()
        try:
            await self.pipe.submit(copy_and_check, self.slot, leaf, offset, data, chunk_crc)
        except Exception as e:
            self.slot.fail(str(e))
            raise

    async def put_many(self, views: list[torch.Tensor], chunks: list[tuple[int, int, int]], bounce: bool,
                       checksum: bool = True) -> list[int]:
        """Copy a whole round in shards, one per worker: per chunk, CRC the source, copy it and CRC the
        staged bytes, piece by piece while each piece is in cache. No event-loop round trip per chunk.
        Always checksummed."""
        workers = self.pipe.pool._max_workers
        shards = [chunks[i::workers] for i in range(workers)]
        loop = asyncio.get_running_loop()
        try:
            done = await asyncio.gather(*(loop.run_in_executor(self.pipe.pool, self._copy_shard, views, shard, bounce)
                                          for shard in shards))
        except Exception as e:
            self.slot.fail(str(e))
            raise
        crcs: dict[tuple[int, int], int] = {}
        for shard, values in zip(shards, done, strict=True):
            crcs.update(((leaf, off), v) for (leaf, off, _), v in zip(shard, values, strict=True))
        self.wire_bytes += sum(n for _, _, n in chunks)
        return [crcs[(leaf, off)] for leaf, off, _ in chunks]

    def _copy_shard(self, views: list[torch.Tensor], shard: list[tuple[int, int, int]], bounce: bool) -> list[int]:
        out = []
        for leaf, off, n in shard:
            src = views[leaf][off:off + n]
            if bounce:
                src = src.clone()
            out.append(copy_and_check(self.slot, leaf, off, src))
        return out

    async def end_round(self) -> None:
        await self._drain()

    async def finish(self) -> int:
        await self._drain()
        try:
            return self.slot.finish()
        except Exception as e:
            self.slot.fail(str(e))
            raise

    async def close(self) -> None:
        self.pipe.cancel()

    async def _drain(self) -> None:
        try:
            await self.pipe.drain()
        except Exception as e:
            self.slot.fail(str(e))
            raise
