"""The in-process transport: both hosts live in this process, so a chunk is a checked tensor copy.

Device to device where both are GPUs, each chunk then fingerprinted on the
device (`libs.motion.devhash`, where the chunks lie on its blocks) rather than
CRC32C'd through host memory; on host
memory, copy and CRCs run piece by piece while each piece is in cache
(`checked_copy.copy_checked`).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any

import torch

from libs.errors import NotFound
from libs.motion import checksum, crc
from libs.motion.checked_copy import copy_and_check
from libs.motion.slot import ShadowSlot
from libs.motion.transport import Channel, Chunk
from libs.schemas.motion import Manifest

# Data-plane addresses served by endpoints in this process: addr -> token lookup.
local_receivers: dict[str, Callable[[str], ShadowSlot]] = {}


class JobWindow:
    """At most `depth` worker-thread jobs in flight; results are checked in submission order."""

    def __init__(self, depth: int = 4, pool: Executor = crc.pool) -> None:
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


class InProcessChannel(Channel):
    def __init__(self, slot: ShadowSlot) -> None:
        self.slot = slot
        self.jobs = JobWindow()
        self.moved = 0

    @classmethod
    def open(cls, dest_addr: str, token: str, layout: Manifest, chunk_bytes: int,
             source_device: str = "cpu") -> InProcessChannel:
        lookup = local_receivers.get(dest_addr)
        if lookup is None:
            raise NotFound(f"no receiver at {dest_addr} in this process", addr=dest_addr)
        slot = lookup(token)
        slot.open(layout, chunk_bytes)
        ch = cls(slot)
        if source_device == slot.device.type == "cuda":
            slot.checksum = ch.checksum = checksum.for_device_move(chunk_bytes)
        return ch

    @property
    def wire_bytes(self) -> int:
        return self.moved

    async def put(self, leaf: int, offset: int, data: torch.Tensor, chunk_crc: int) -> None:
        self.moved += data.numel()
        try:
            await self.jobs.submit(copy_and_check, self.slot, leaf, offset, data, chunk_crc)
        except Exception as e:
            self.slot.fail(str(e))
            raise

    async def put_many(self, views: list[torch.Tensor], chunks: list[Chunk], *, bounce: bool,
                       checksum: bool = True) -> list[int]:
        """Copy a whole round in shards, one per worker: per chunk, CRC the source, copy it and CRC the
        staged bytes, piece by piece while each piece is in cache. No event-loop round trip per chunk.
        Always checksummed: the staged check needs the source CRC, and here it costs no extra pass."""
        workers = self.jobs.pool._max_workers  # type: ignore[attr-defined]
        shards = [chunks[i::workers] for i in range(workers)]
        loop = asyncio.get_running_loop()
        try:
            done = await asyncio.gather(*(loop.run_in_executor(self.jobs.pool, self._copy_shard, views, shard, bounce)
                                          for shard in shards))
        except Exception as e:
            self.slot.fail(str(e))
            raise
        crcs: dict[tuple[int, int], int] = {}
        for shard, values in zip(shards, done, strict=True):
            crcs.update(((leaf, off), v) for (leaf, off, _), v in zip(shard, values, strict=True))
        self.moved += sum(n for _, _, n in chunks)
        return [crcs[(leaf, off)] for leaf, off, _ in chunks]

    def _copy_shard(self, views: list[torch.Tensor], shard: list[Chunk], bounce: bool) -> list[int]:
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
        self.jobs.cancel()

    async def _drain(self) -> None:
        try:
            await self.jobs.drain()
        except Exception as e:
            self.slot.fail(str(e))
            raise
