"""The Mooncake transfer engine as a byte mover under our TCP control stream (optional).

Mooncake (PyPI `mooncake-transfer-engine-non-cuda`, needs Debian `libibverbs1`)
speaks TCP here and RDMA on clusters. It only moves bytes: the hello, the
token, the per-chunk frames with their CRC32C and the final acknowledgement
still run over our TCP channel, and the receiver checksums every chunk over
its staged memory exactly as for TCP payloads. A frame with the `mooncake`
codec carries no payload: its bytes were written into the receiver's
registered slot memory before the frame was sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque

import msgspec
import torch

from libs.errors import IntegrityError, Unavailable
from libs.motion import crc, netio, wire
from libs.motion.pool import StagingPool
from libs.motion.prefetch import PREFETCH, Prefetch
from libs.motion.slot import ShadowSlot
from libs.motion.stream import FrameStream
from libs.motion.transport import Channel, Chunk
from libs.schemas.motion import Manifest

try:
    from mooncake.engine import TransferEngine

    IMPORT_ERROR = ""
except ImportError as e:  # the wheel is missing, or libibverbs.so.1 is
    TransferEngine = None
    IMPORT_ERROR = str(e)

READY = msgspec.msgpack.Encoder()
MAX_READY_BYTES = 64 << 20
INFLIGHT = 8  # writes submitted and not yet complete (4-8 measured ~5x one at a time on loopback)
RING = INFLIGHT + PREFETCH + 1  # bounce buffers: one per chunk that can be copied, queued or in flight
CODEC = wire.CODECS["mooncake"]


class MooncakeEngine:
    """One transfer engine per process side; `session` is what peers address it by. Writes are submitted
    and then polled with a backoff (never `transfer_sync_write`, which spins a core while it waits)."""

    def __init__(self, host: str = "127.0.0.1", protocol: str = "tcp") -> None:
        if TransferEngine is None:
            raise Unavailable(f"mooncake transfer engine does not import: {IMPORT_ERROR}")
        self.engine = TransferEngine()
        if self.engine.initialize(host, "P2PHANDSHAKE", protocol, "") != 0:
            raise Unavailable("mooncake transfer engine failed to initialize")
        self.session = f"{host}:{self.engine.get_rpc_port()}"
        self.pool_fd = -1  # the staging pool registered once for good (its regions need no registration)
        self.rings: dict[int, list[torch.Tensor]] = {}  # chunk size -> registered bounce buffers, kept

    def register(self, t: torch.Tensor) -> None:
        if t.numel() and self.engine.register_memory(t.data_ptr(), t.numel() * t.element_size()) != 0:
            raise Unavailable("mooncake could not register memory")

    def unregister(self, t: torch.Tensor) -> None:
        if t.numel():
            self.engine.unregister_memory(t.data_ptr())

    def register_pool(self, staging: StagingPool) -> None:
        if staging.capacity and self.engine.register_memory(staging.base_ptr, staging.capacity) != 0:
            raise Unavailable("mooncake could not register the staging pool")
        self.pool_fd = staging.fd

    def ring(self, chunk_bytes: int) -> list[torch.Tensor]:
        """Bounce buffers for live (pre-copy) rounds, registered once per chunk size and reused."""
        if chunk_bytes not in self.rings:
            bufs = [torch.empty(chunk_bytes, dtype=torch.uint8) for _ in range(RING)]
            for b in bufs:
                self.register(b)
            self.rings[chunk_bytes] = bufs
        return self.rings[chunk_bytes]

    def submit(self, peer: str, local_ptr: int, remote_ptr: int, nbytes: int) -> int:
        batch = self.engine.transfer_submit_write(peer, local_ptr, remote_ptr, nbytes)
        if batch < 0:
            raise Unavailable(f"mooncake refused a write of {nbytes} bytes to {peer} ({batch})")
        return batch

    def wait(self, batch: int) -> None:
        """Poll one submitted write with exponential backoff (20 µs .. 1 ms), on a worker thread."""
        pause = 20e-6
        while (status := self.engine.transfer_check_status(batch)) == 0:
            time.sleep(pause)
            pause = min(pause * 2, 1e-3)
        if status != 1:
            raise Unavailable(f"mooncake write failed ({'timed out' if status == -2 else status})")


# ---------------------------------------------------------------- receiver side


def offer(engine: MooncakeEngine | None, slot: ShadowSlot) -> tuple[list[torch.Tensor], bytes]:
    """The ready message that tells the sender where to write, and what had to be registered for it (for
    `withdraw`): nothing for a slot in the registered staging pool, else the slot's leaves."""
    if engine is None or slot.device.type != "cpu":
        raise IntegrityError("this receiver offers no mooncake transfer for this slot")
    in_pool = slot.memory is not None and slot.memory.pooled and slot.memory.fd == engine.pool_fd
    registered: list[torch.Tensor] = []
    try:
        for t in ([] if in_pool else slot.flats):
            engine.register(t)
            registered.append(t)
    except Unavailable:
        withdraw(engine, registered)
        raise
    body = READY.encode([engine.session, [f.data_ptr() for f in slot.flats]])
    return registered, len(body).to_bytes(4, "little") + body


def withdraw(engine: MooncakeEngine, registered: list[torch.Tensor]) -> None:
    for t in registered:
        engine.unregister(t)


# ---------------------------------------------------------------- sender side


class MooncakeChannel(Channel):
    """Bytes by Mooncake straight from the source leaves into the receiver's slot, INFLIGHT writes at a
    time; each chunk's frame (with the CRC taken ahead on the worker pool) goes out on our TCP stream
    once its write has completed. Live rounds write from registered bounce buffers instead."""

    def __init__(self, stream: FrameStream, engine: MooncakeEngine, peer: str, remote: list[int]) -> None:
        self.stream, self.engine, self.peer, self.remote = stream, engine, peer, remote
        self.sources: dict[int, torch.Tensor] = {}  # source leaves registered for this move, by address

    @classmethod
    async def open(cls, engine: MooncakeEngine, dest_addr: str, token: str, layout: Manifest,
                   chunk_bytes: int) -> MooncakeChannel:
        stream = await FrameStream.open(dest_addr, token, layout, chunk_bytes, codec="mooncake")
        try:
            n = int.from_bytes(await stream.recv(4), "little")
            if n > MAX_READY_BYTES:
                raise IntegrityError("oversized mooncake ready message")
            peer, remote = msgspec.msgpack.decode(await stream.recv(n))
            host, _ = netio.split_addr(dest_addr)
            return cls(stream, engine, f"{host}:{peer.rpartition(':')[2]}", remote)
        except BaseException:
            await stream.close()
            raise

    @property
    def wire_bytes(self) -> int:
        return self.stream.wire_bytes

    async def put(self, leaf: int, offset: int, data: torch.Tensor, chunk_crc: int) -> None:
        raise Unavailable("the mooncake transport moves whole rounds (put_many), not loose chunks")

    async def put_many(self, views: list[torch.Tensor], chunks: list[Chunk], *, bounce: bool,
                       checksum: bool = True) -> list[int]:
        if any(v.device.type != "cpu" for v in views):
            raise Unavailable("the mooncake transport moves host memory only in this build")
        try:
            return await asyncio.to_thread(self._send_round, views, chunks, bounce)
        except OSError as e:
            raise Unavailable(f"data plane connection lost: {e}") from None

    def _source(self, views: list[torch.Tensor], c: Chunk, ring: list[torch.Tensor], i: int) -> tuple[int, int]:
        """(address to write from, CRC of those bytes) for chunk `c`, the `i`-th of its round."""
        leaf, off, n = c
        src = views[leaf][off:off + n]
        if ring:
            stage = ring[i % RING][:n]
            stage.copy_(src)
            return stage.data_ptr(), crc.crc_bytes(stage)
        return src.data_ptr(), crc.crc_bytes(src)

    def _send_round(self, views: list[torch.Tensor], chunks: list[Chunk], bounce: bool) -> list[int]:
        ring = self.engine.ring(self.stream_chunk(chunks)) if bounce else []
        if not bounce:
            for v in views:
                if v.numel() and v.data_ptr() not in self.sources:
                    self.engine.register(v)
                    self.sources[v.data_ptr()] = v
        out: list[int] = []
        inflight: deque[tuple[int, bytes]] = deque()
        try:
            with Prefetch(lambda ic: self._source(views, ic[1], ring, ic[0]), list(enumerate(chunks))) as ahead:
                for (leaf, off, n), job in zip(chunks, ahead, strict=True):
                    ptr, value = job.result()
                    batch = self.engine.submit(self.peer, ptr, self.remote[leaf] + off, n)
                    inflight.append((batch, self.stream.data_frame(CODEC, leaf, off, n, 0, value, moved=n)))
                    out.append(value)
                    while len(inflight) >= INFLIGHT:
                        self._complete(inflight)
            while inflight:
                self._complete(inflight)
        finally:
            for batch, _ in inflight:  # a failed round: let the engine finish what it holds before we go
                with contextlib.suppress(Unavailable):
                    self.engine.wait(batch)
        return out

    def _complete(self, inflight: deque[tuple[int, bytes]]) -> None:
        batch, frame = inflight[0]
        self.engine.wait(batch)
        inflight.popleft()
        self.stream.send_blocking(frame)

    @staticmethod
    def stream_chunk(chunks: list[Chunk]) -> int:
        return max((n for _, _, n in chunks), default=1)

    async def end_round(self) -> None:
        await self.stream.end_round()

    async def finish(self) -> int:
        return await self.stream.finish()

    async def close(self) -> None:
        withdraw(self.engine, list(self.sources.values()))
        self.sources = {}
        await self.stream.close()
