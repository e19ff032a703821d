"""The shared-memory transport: a same-machine move with one copy and no socket payloads.

Host slots (`memfd` mode): every host slot lives in a memfd region (the staging
pool's, or a fresh one; `libs.motion.pool`). The receiver tells the sender its
pid, the region's fd, offset and length and each leaf's place in it. The sender
then says how the bytes will come (`Plan`), once, before its first frame:

- `pull` (a frozen host source, the stop-and-copy case): the sender gives its pid
  and each leaf's address and only checksums its chunks; the receiver reads each
  chunk straight out of the sender's memory into the slot (`libs.motion.cma`,
  one kernel copy, nothing mapped on either side) and checksums it while it is
  in cache. The two CRC passes run on the two processes' cores at once. The
  receiver first reads back a random secret the sender announced and answers
  whether pulling works here: a kernel that forbids the read, or a pid that is
  another process here, gets a push instead.
- `push` (a live pre-copy round, a device source, or a refused pull): the sender
  maps exactly the receiver's region (`/proc/<pid>/fd/<fd>`, same user) and
  writes each chunk straight into the staged leaf, checksumming the source as it
  copies.

Device slots (`cuda_ipc` mode, source and destination on CUDA): the sender
sends CUDA IPC handles of its (frozen) leaf storages; the receiver opens them
and copies each chunk device to device on its own stream. Where the chunks lie
on the device fingerprint's blocks (as the DEVICE_CHUNK_BYTES an engine host
sends do), both sides fingerprint them on their devices (`libs.motion.devhash`,
the move's `checksum` kind) rather than CRC32C them through host memory; few
and large chunks, since each costs a few kernels and one sync on either side.

Either way the frames, the one-time token, the chunk CRCs and the final
acknowledgement travel on the TCP control stream exactly as for TCP payloads
(a frame with the `shm` codec carries none), and the receiver checksums every
chunk over its own staged memory before it counts. The sender unmaps on every
outcome; a pooled region a peer mapped stays out of the pool after a failed
move until no other process maps it (`StagingPool.expose`). A pulled region is
never mapped by a peer, and only the receiver's own threads write it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import mmap
import os
from collections.abc import Awaitable, Callable
from typing import TypeVar

import msgspec
import numpy as np
import torch

from libs.errors import IntegrityError, Unavailable
from libs.motion import checksum, cma, crc, wire
from libs.motion.checked_copy import check_staged, copy_out, pull_checked
from libs.motion.prefetch import Prefetch
from libs.motion.slot import ShadowSlot
from libs.motion.stream import FrameStream
from libs.motion.transport import Channel, Chunk
from libs.schemas.motion import Manifest

CODEC = wire.CODECS["shm"]
MAX_MESSAGE_BYTES = 16 << 20
DEVICE_CHUNK_BYTES = 64 << 20  # the chunk of a move between CUDA devices
M = TypeVar("M", bound=msgspec.Struct)


class Ready(msgspec.Struct, array_like=True):
    """The receiver's answer to an `shm` hello: where to write (memfd), or send IPC handles (cuda_ipc)."""

    mode: str  # "memfd" | "cuda_ipc"
    pid: int = 0
    fd: int = -1
    offset: int = 0
    length: int = 0
    leaves: list[int] = []  # each leaf's byte offset within the region


class Plan(msgspec.Struct, array_like=True):
    """The sender's answer to a `memfd` Ready: pull from `leaves` (addresses in process `pid`), or push.
    `secret` lies at `secret_at` in the sender: reading it back proves the receiver reads the sender's
    memory (not another process's under that pid, in another pid namespace or after a pid was reused)."""

    pull: bool
    pid: int = 0
    leaves: list[int] = []
    secret_at: int = 0
    secret: bytes = b""


class Accepted(msgspec.Struct, array_like=True):
    """The receiver's answer to a pull plan: whether it could read the sender's memory."""

    pull: bool
    reason: str = ""


class CudaLeaf(msgspec.Struct, array_like=True):
    """`torch.UntypedStorage._share_cuda_()` of one leaf's storage, plus where the leaf's bytes start."""

    device: int
    handle: bytes
    storage_bytes: int
    storage_offset: int
    ref_handle: bytes
    ref_offset: int
    event_handle: bytes
    event_sync: bool
    byte_offset: int  # of the leaf within the storage


def message(msg: msgspec.Struct) -> bytes:
    body = msgspec.msgpack.encode(msg)
    return len(body).to_bytes(4, "little") + body


async def _read(recv: Callable[[int], Awaitable[bytes]], kind: type[M]) -> M:
    n = int.from_bytes(await recv(4), "little")
    if n > MAX_MESSAGE_BYTES:
        raise IntegrityError("oversized shared-memory message")
    return msgspec.msgpack.decode(await recv(n), type=kind)


# ---------------------------------------------------------------- receiver side


def ready_for(slot: ShadowSlot) -> Ready:
    """The offer for an opened slot; a device slot's chunks are fingerprinted on the device from here on."""
    if slot.device.type == "cuda":
        slot.checksum = checksum.for_device_move(slot.chunk_bytes)  # the sender decides alike
        return Ready("cuda_ipc", os.getpid())
    if slot.memory is None:
        raise IntegrityError("this slot has no shared memory to offer")
    m = slot.memory
    if slot.pool is not None and m.pooled:
        slot.pool.expose(m)
    return Ready("memfd", os.getpid(), m.fd, m.offset, m.length, slot.leaf_offsets)


async def agree(recv: Callable[[int], Awaitable[bytes]], send: Callable[[bytes], Awaitable[None]],
                slot: ShadowSlot, layout: Manifest) -> Plan | None:
    """Read the sender's plan for a `memfd` slot; for a pull, read its secret back and say whether pulling
    works. Returns the plan to pull by, or None when the sender pushes."""
    plan = await _read(recv, Plan)
    if not plan.pull:
        return None
    if len(plan.leaves) != len(layout.leaves):
        raise IntegrityError("the sender's pull plan does not match the layout")
    reason = await asyncio.to_thread(_probe, plan)
    await send(message(Accepted(not reason, reason)))
    if reason:
        return None
    settle(slot)  # no peer maps this region: only our own reads write it
    return plan


def _probe(plan: Plan) -> str:
    """Why this receiver cannot pull from the sender ("" when it can)."""
    got = np.zeros(len(plan.secret), dtype=np.uint8)
    try:
        cma.read_into(plan.pid, plan.secret_at, got)
    except OSError as e:
        return str(e)
    if not plan.secret or got.tobytes() != plan.secret:
        return f"pid {plan.pid} here is not the sender"
    return ""


def pull_host(slot: ShadowSlot, plan: Plan, f: wire.Frame, region: torch.Tensor) -> None:
    """Read one chunk from the sender's frozen memory into `region` and check it against the frame's CRC."""
    try:
        pull_checked(slot, f.leaf, f.offset, region, plan.pid, plan.leaves[f.leaf] + f.offset, f.crc)
    except OSError as e:
        raise Unavailable(f"cannot read the sender's memory (gone mid-copy?): {e}") from None


def settle(slot: ShadowSlot) -> None:
    """Every frame arrived: the sender has no writes left, the region may go back to the pool as usual."""
    if slot.pool is not None and slot.memory is not None and slot.memory.pooled:
        slot.pool.settle(slot.memory)


def open_sources(leaves: list[CudaLeaf], layout: Manifest) -> list[torch.Tensor]:
    """The sender's leaf bytes on this device, opened from their IPC handles (flat uint8 views).
    An empty leaf has no handle (its storage has no memory to share) and no chunk ever reads it."""
    out = []
    for leaf, spec in zip(leaves, layout.leaves, strict=True):
        if spec.nbytes == 0:
            out.append(torch.empty(0, dtype=torch.uint8))
            continue
        if not leaf.handle:
            raise IntegrityError(f"no IPC handle for the non-empty leaf {spec.path}")
        storage = torch.UntypedStorage._new_shared_cuda(
            leaf.device, leaf.handle, leaf.storage_bytes, leaf.storage_offset, leaf.ref_handle, leaf.ref_offset,
            leaf.event_handle, leaf.event_sync)
        if leaf.byte_offset + spec.nbytes > storage.nbytes():
            raise IntegrityError(f"IPC handle for {spec.path} is smaller than the leaf")
        t = torch.empty(0, dtype=torch.uint8, device=f"cuda:{leaf.device}")
        out.append(t.set_(storage, leaf.byte_offset, (spec.nbytes,)))
    return out


def copy_stream(slot: ShadowSlot, leaves: list[CudaLeaf]) -> torch.cuda.Stream:
    """The stream the chunks are copied on, ordered after this thread's current streams: opening the
    handles made those wait for the sender's writes (its IPC events), and the slot's memory was allocated
    on the slot device's, perhaps reusing blocks that kernels queued there still read."""
    stream = torch.cuda.Stream(slot.device)
    for index in {slot.device.index, *(leaf.device for leaf in leaves if leaf.handle)}:
        stream.wait_stream(torch.cuda.current_stream(index))
    return stream


def pull_and_check(slot: ShadowSlot, sources: list[torch.Tensor], stream, f: wire.Frame, region: torch.Tensor) -> None:
    """Copy one chunk device to device on the receiver's stream, then check its device fingerprint over
    the staged bytes (the sync makes the copy visible to this thread's stream, where the check runs)."""
    with torch.cuda.stream(stream):
        region.copy_(sources[f.leaf][f.offset:f.offset + f.length], non_blocking=True)
    stream.synchronize()
    check_staged(slot, f.leaf, f.offset, region, f.crc)


# ---------------------------------------------------------------- sender side


class ShmChannel(Channel):
    def __init__(self, stream: FrameStream, ready: Ready, layout: Manifest) -> None:
        self.stream, self.ready, self.layout = stream, ready, layout
        self.dst: list[torch.Tensor] = []
        self.mapping: mmap.mmap | None = None
        self.plan: Plan | None = None  # memfd mode: fixed by the first round
        self.sources: list[torch.Tensor] = []  # a pull's leaves: kept alive until the receiver has read them
        self.secret = np.zeros(0, dtype=np.uint8)
        self.handles_sent = False

    @classmethod
    async def open(cls, dest_addr: str, token: str, layout: Manifest, chunk_bytes: int) -> ShmChannel:
        stream = await FrameStream.open(dest_addr, token, layout, chunk_bytes, codec="shm")
        try:
            ready = await _read(stream.recv, Ready)
            if ready.mode == "memfd" and (len(ready.leaves) != len(layout.leaves) or any(
                    off < 0 or off + leaf.nbytes > ready.length
                    for off, leaf in zip(ready.leaves, layout.leaves, strict=True))):
                raise IntegrityError("the receiver's region does not hold the layout")
            ch = cls(stream, ready, layout)
            if ready.mode == "cuda_ipc":
                ch.checksum = checksum.for_device_move(chunk_bytes)  # as the receiver's `ready_for`
            return ch
        except BaseException:
            await stream.close()
            raise

    @property
    def wire_bytes(self) -> int:
        return self.stream.wire_bytes

    async def put(self, leaf: int, offset: int, data: torch.Tensor, chunk_crc: int) -> None:
        raise Unavailable("the shared-memory transport moves whole rounds (put_many), not loose chunks")

    async def put_many(self, views: list[torch.Tensor], chunks: list[Chunk], *, bounce: bool,
                       checksum: bool = True) -> list[int]:
        try:
            if self.ready.mode == "cuda_ipc":
                await self._send_handles(views, bounce)
                return await asyncio.to_thread(self._send_round, chunks, functools.partial(self._fingerprint, views))
            if self.plan is None:
                await self._choose(views, bounce)
            assert self.plan is not None
            if self.plan.pull:
                if bounce or [v.data_ptr() for v in views] != [s.data_ptr() for s in self.sources]:
                    raise Unavailable("a pulled move sends frozen rounds of the leaves it announced")
                return await asyncio.to_thread(self._send_round, chunks, functools.partial(self._checksum, views))
            return await asyncio.to_thread(self._send_round, chunks, functools.partial(self._copy, views, bounce))
        except OSError as e:
            raise Unavailable(f"data plane connection lost: {e}") from None

    async def _choose(self, views: list[torch.Tensor], bounce: bool) -> None:
        """Pull where the round is frozen host memory and the receiver can read it; otherwise map and push."""
        if not bounce and all(v.device.type == "cpu" for v in views):
            pull = self._pull_plan(views)
            self.sources = list(views)
            await self.stream.send(message(pull))
            if (await _read(self.stream.recv, Accepted)).pull:
                self.plan = pull
                return
            self.sources = []
        else:
            await self.stream.send(message(Plan(False)))
        self.plan = Plan(False)
        try:
            self.mapping = await asyncio.to_thread(_map, self.ready)
        except OSError as e:
            raise Unavailable(f"cannot map the receiver's shared memory: {e}") from None
        arena = np.frombuffer(self.mapping, dtype=np.uint8)
        self.dst = [torch.from_numpy(arena[off:off + leaf.nbytes])
                    for off, leaf in zip(self.ready.leaves, self.layout.leaves, strict=True)]

    def _pull_plan(self, views: list[torch.Tensor]) -> Plan:
        self.secret = np.frombuffer(os.urandom(16), dtype=np.uint8).copy()  # kept alive until close
        return Plan(True, os.getpid(), [v.data_ptr() for v in views], self.secret.ctypes.data, self.secret.tobytes())

    def _fingerprint(self, views: list[torch.Tensor], c: Chunk) -> int:
        """A device chunk's value, taken over the frozen leaf the receiver copies from: on the device
        (devhash), or CRC32C through host memory where the chunks are off its blocks."""
        leaf, off, n = c
        return checksum.of_bytes(self.checksum, views[leaf][off:off + n], off)

    def _checksum(self, views: list[torch.Tensor], c: Chunk) -> int:
        """A pulled chunk's CRC, taken over the frozen source memory the receiver is about to read."""
        leaf, off, n = c
        return crc.crc_bytes(views[leaf][off:off + n])

    def _copy(self, views: list[torch.Tensor], bounce: bool, c: Chunk) -> int:
        leaf, off, n = c
        return copy_out(self.dst[leaf][off:off + n], views[leaf][off:off + n], bounce=bounce)

    def _send_round(self, chunks: list[Chunk], job) -> list[int]:
        """Each chunk's frame goes out as soon as its bytes are in place, or (pull) checksummed for the
        receiver to read; that work runs ahead on the pool."""
        out: list[int] = []
        with Prefetch(job, chunks) as ahead:
            for (leaf, off, n), fut in zip(chunks, ahead, strict=True):
                value = fut.result()
                frame = self.stream.data_frame(CODEC, leaf, off, n, 0, checksum.on_wire(self.checksum, value), moved=n)
                self.stream.send_blocking(frame)
                out.append(value)
        return out

    async def _send_handles(self, views: list[torch.Tensor], bounce: bool) -> None:
        """CUDA IPC exposes the live leaves themselves, so only a frozen round can go this way."""
        if bounce:
            raise Unavailable("CUDA IPC moves only frozen state: use stop-and-copy or TCP for pre-copy")
        if self.handles_sent:
            raise Unavailable("CUDA IPC sends one frozen round per move")
        if any(v.device.type != "cuda" for v in views):
            raise Unavailable("the receiver's slot is on CUDA but the source is not")
        await self.stream.send(message(_Handles([cuda_leaf(v) for v in views])))
        self.handles_sent = True

    async def end_round(self) -> None:
        await self.stream.end_round()

    async def finish(self) -> int:
        return await self.stream.finish()

    async def close(self) -> None:
        await self.stream.close()
        self.dst, self.sources = [], []
        if self.mapping is not None:
            with contextlib.suppress(BufferError):  # a view still alive somewhere: unmapped when it goes
                self.mapping.close()
            self.mapping = None


def cuda_leaf(view: torch.Tensor) -> CudaLeaf:
    """The IPC description of a flat uint8 leaf. An empty one is sent without a handle: its storage may
    have no memory (`_share_cuda_` then answers None for the handles) and the receiver reads none of it."""
    if view.numel() == 0:
        return CudaLeaf(view.device.index or 0, b"", 0, 0, b"", 0, b"", False, 0)
    dev, handle, size, off, ref_h, ref_off, ev_h, ev_sync = view.untyped_storage()._share_cuda_()
    return CudaLeaf(dev, handle, size, off, ref_h, ref_off, ev_h, ev_sync, view.storage_offset())


class _Handles(msgspec.Struct, array_like=True):
    leaves: list[CudaLeaf]


def _map(ready: Ready) -> mmap.mmap:
    """Map exactly the receiver's region, page tables filled in one call."""
    fd = os.open(f"/proc/{ready.pid}/fd/{ready.fd}", os.O_RDWR)
    try:
        return mmap.mmap(fd, max(ready.length, 1), flags=mmap.MAP_SHARED | mmap.MAP_POPULATE, offset=ready.offset)
    finally:
        os.close(fd)


async def read_handles(recv: Callable[[int], Awaitable[bytes]]) -> list[CudaLeaf]:
    return (await _read(recv, _Handles)).leaves

