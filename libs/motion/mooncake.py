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

import msgspec
import torch

from libs.errors import IntegrityError, Unavailable
from libs.motion import crc, netio, wire
from libs.motion.slot import ShadowSlot
from libs.motion.stream import FrameStream
from libs.motion.transport import Channel
from libs.schemas.motion import Manifest

try:
    from mooncake.engine import TransferEngine

    IMPORT_ERROR = ""
except ImportError as e:  # the wheel is missing, or libibverbs.so.1 is
    TransferEngine = None
    IMPORT_ERROR = str(e)

READY = msgspec.msgpack.Encoder()
MAX_READY_BYTES = 64 << 20
STAGING_SLOTS = 2
CODEC = wire.CODECS["mooncake"]


class MooncakeEngine:
    """One transfer engine per process side; `session` is what peers address it by."""

    def __init__(self, host: str = "127.0.0.1", protocol: str = "tcp") -> None:
        if TransferEngine is None:
            raise Unavailable(f"mooncake transfer engine does not import: {IMPORT_ERROR}")
        self.engine = TransferEngine()
        if self.engine.initialize(host, "P2PHANDSHAKE", protocol, "") != 0:
            raise Unavailable("mooncake transfer engine failed to initialize")
        self.session = f"{host}:{self.engine.get_rpc_port()}"

    def register(self, t: torch.Tensor) -> None:
        if t.numel() and self.engine.register_memory(t.data_ptr(), t.numel() * t.element_size()) != 0:
            raise Unavailable("mooncake could not register memory")

    def unregister(self, t: torch.Tensor) -> None:
        if t.numel():
            self.engine.unregister_memory(t.data_ptr())

    def write(self, peer: str, local_ptr: int, remote_ptr: int, nbytes: int) -> None:
        if self.engine.transfer_sync_write(peer, local_ptr, remote_ptr, nbytes) != 0:
            raise Unavailable(f"mooncake write of {nbytes} bytes to {peer} failed")


# ---------------------------------------------------------------- receiver side


def offer(engine: MooncakeEngine | None, slot: ShadowSlot) -> tuple[list[torch.Tensor], bytes]:
    """Register the slot's staged memory with `engine`; returns what was registered (for `withdraw`) and
    the ready message that tells the sender where to write."""
    if engine is None or slot.device.type != "cpu":
        raise IntegrityError("this receiver offers no mooncake transfer for this slot")
    registered = []
    try:
        for t in slot.flats:
            engine.register(t)
            registered.append(t)
    except Unavailable:
        withdraw(engine, registered)
        raise
    body = READY.encode([engine.session, [f.data_ptr() for f in registered]])
    return registered, len(body).to_bytes(4, "little") + body


def withdraw(engine: MooncakeEngine, registered: list[torch.Tensor]) -> None:
    for t in registered:
        engine.unregister(t)


# ---------------------------------------------------------------- sender side


class MooncakeChannel(Channel):
    """Bytes by Mooncake into the receiver's registered slot, chunk by chunk through `put` (the base
    `put_many` reads and checksums ahead); frames and CRCs by our TCP stream."""

    def __init__(self, stream: FrameStream, engine: MooncakeEngine, peer: str, remote: list[int]) -> None:
        self.stream, self.engine, self.peer, self.remote = stream, engine, peer, remote
        self.staging: list[torch.Tensor] = []  # registered host buffers the engine writes from, in turn
        self.turn = 0

    @classmethod
    async def open(cls, engine: MooncakeEngine, dest_addr: str, token: str, layout: Manifest,
                   chunk_bytes: int) -> MooncakeChannel:
        stream = await FrameStream.open(dest_addr, token, layout, chunk_bytes, codec="mooncake")
        ch: MooncakeChannel | None = None
        try:
            n = int.from_bytes(await stream.recv(4), "little")
            if n > MAX_READY_BYTES:
                raise IntegrityError("oversized mooncake ready message")
            peer, remote = msgspec.msgpack.decode(await stream.recv(n))
            host, _ = netio.split_addr(dest_addr)
            ch = cls(stream, engine, f"{host}:{peer.rpartition(':')[2]}", remote)
            for _ in range(STAGING_SLOTS):
                t = torch.empty(chunk_bytes, dtype=torch.uint8)
                engine.register(t)
                ch.staging.append(t)
            return ch
        except BaseException:
            await (ch.close() if ch is not None else stream.close())
            raise

    @property
    def wire_bytes(self) -> int:
        return self.stream.wire_bytes

    async def put(self, leaf: int, offset: int, data: torch.Tensor, chunk_crc: int) -> None:
        stage = self.staging[self.turn % STAGING_SLOTS][: data.numel()]
        self.turn += 1
        await asyncio.get_running_loop().run_in_executor(crc.pool, self._write, stage, data,
                                                         self.remote[leaf] + offset)
        await self.stream.send(self.stream.data_frame(CODEC, leaf, offset, data.numel(), 0, chunk_crc,
                                                      moved=data.numel()))

    def _write(self, stage: torch.Tensor, data: torch.Tensor, remote_ptr: int) -> None:
        stage.copy_(data)
        self.engine.write(self.peer, stage.data_ptr(), remote_ptr, data.numel())

    async def end_round(self) -> None:
        await self.stream.end_round()

    async def finish(self) -> int:
        return await self.stream.finish()

    async def close(self) -> None:
        withdraw(self.engine, self.staging)
        self.staging = []
        await self.stream.close()
