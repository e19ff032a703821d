"""The transport interface: a `Channel` carries one move's chunks into the destination's slot.

The sender hands a channel (leaf, offset, bytes, CRC) chunks; the channel gets
them into the destination's shadow slot, where each chunk is checksummed again
over the staged memory. No transport is trusted to say "bytes arrived": the
receiver's own CRCs, then `verify` over the whole staged copy, decide.

Every transport implements `put` (one chunk), `end_round`, `finish` and
`close`, and reports `wire_bytes`. `put_many` (a whole round) has a concrete
default that reads and checksums chunks ahead on the worker pool and `put`s
each one; a transport that can do better (a round on one thread, a sharded
copy) overrides it under the same contract. The transports:

- in-process (`libs.motion.inprocess`): both hosts in this process; a tensor
  copy into the slot, device to device where both are GPUs;
- TCP (`libs.motion.tcp`): chunked, pipelined, per-chunk CRC32C, one-time token;
- Mooncake (`libs.motion.mooncake`): bytes by the transfer engine, frames by TCP.
"""

from __future__ import annotations

import asyncio
import functools
from abc import ABC, abstractmethod

import torch

from libs.motion import checksum, crc
from libs.motion.prefetch import Prefetch

Chunk = tuple[int, int, int]  # leaf, offset, length (bytes)


def read_chunk(views: list[torch.Tensor], c: Chunk, *, bounce: bool, checksum: bool,
               to_host: bool = False) -> tuple[torch.Tensor, int]:
    """A chunk's bytes and their CRC32C (0 when `checksum` is off). `bounce` copies them first, so the
    bytes sent are exactly the bytes checksummed while the session keeps writing; `to_host` makes
    device bytes a host copy (one copy serves as the bounce buffer too)."""
    leaf, off, n = c
    data = views[leaf][off:off + n]
    if to_host and data.device.type != "cpu":
        data = data.to("cpu")
    elif bounce:
        data = data.clone()
    return data, crc.crc_bytes(data) if checksum else 0


class Channel(ABC):
    """One move's path into the destination slot."""

    checksum = checksum.CRC32C  # the kind of value its chunk CRCs are (`libs.motion.checksum`), fixed at open

    @property
    @abstractmethod
    def wire_bytes(self) -> int:
        """Bytes moved so far, payload and framing (what the move reports as its wire cost)."""

    @abstractmethod
    async def put(self, leaf: int, offset: int, data: torch.Tensor, chunk_crc: int) -> None:
        """Send one chunk (a flat uint8 tensor) whose decoded bytes have CRC32C `chunk_crc`."""

    async def put_many(self, views: list[torch.Tensor], chunks: list[Chunk], *, bounce: bool,
                       checksum: bool = True) -> list[int]:
        """Send `chunks` of the flat byte `views`; returns their CRCs in order. Up to PREFETCH chunks are
        read and checksummed ahead on the worker pool while the current one is `put`."""
        read = functools.partial(read_chunk, views, bounce=bounce, checksum=checksum)
        out: list[int] = []
        with Prefetch(read, chunks) as ahead:
            for (leaf, off, _), job in zip(chunks, ahead, strict=True):
                data, value = await asyncio.wrap_future(job)
                await self.put(leaf, off, data, value)
                out.append(value)
        return out

    @abstractmethod
    async def end_round(self) -> None:
        """Every chunk of this round has been handed over (the receiver may count them)."""

    @abstractmethod
    async def finish(self) -> int:
        """All chunks sent: the receiver's digest of its staged leaf CRCs (raises if it refused)."""

    @abstractmethod
    async def close(self) -> None:
        """Release the channel, finished or not; safe to call after a failure."""
