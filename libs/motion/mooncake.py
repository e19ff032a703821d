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
from libs.motion import crc, wire
from libs.motion.tcp import TcpChannel, recv_blocking, split_addr

try:
    from mooncake.engine import TransferEngine

    IMPORT_ERROR = ""
except ImportError as e:  # the wheel is missing, or libibverbs.so.1 is
    TransferEngine = None
    IMPORT_ERROR = str(e)

READY = msgspec.msgpack.Encoder()
STAGING_SLOTS = 2


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


def ready_message(engine: MooncakeEngine, flats: list[torch.Tensor]) -> bytes:
    body = READY.encode([engine.session, [f.data_ptr() for f in flats]])
    return len(body).to_bytes(4, "little") + body


class MooncakeChannel(TcpChannel):
    """Bytes by Mooncake into the receiver's registered slot; frames and CRCs by our TCP stream."""

    engine: MooncakeEngine
    peer: str
    remote: list[int]
    staging: list[torch.Tensor]
    turn: int = 0
    put_many = None  # bytes go by Mooncake chunk by chunk, through `put`

    @classmethod
    async def open_mooncake(cls, engine: MooncakeEngine, dest_addr: str, token: str, layout, chunk_bytes: int,
                            ) -> MooncakeChannel:
        ch = await cls.open(dest_addr, token, layout, chunk_bytes, codec="mooncake")
        n = int.from_bytes(await asyncio.to_thread(recv_blocking, ch.sock, 4), "little")
        if n > 64 << 20:
            raise IntegrityError("oversized mooncake ready message")
        peer, remote = msgspec.msgpack.decode(await asyncio.to_thread(recv_blocking, ch.sock, n))
        host, _ = split_addr(dest_addr)
        ch.engine, ch.peer, ch.remote = engine, f"{host}:{peer.rpartition(':')[2]}", remote
        ch.staging = [torch.empty(chunk_bytes, dtype=torch.uint8) for _ in range(STAGING_SLOTS)]
        for t in ch.staging:
            engine.register(t)
        return ch

    async def put(self, leaf: int, offset: int, data: torch.Tensor, chunk_crc: int) -> None:
        stage = self.staging[self.turn % STAGING_SLOTS][: data.numel()]
        self.turn += 1
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(crc.pool, self._write, stage, data, self.remote[leaf] + offset)
        frame = wire.Frame(wire.DATA, wire.CODECS["mooncake"], self.seq, leaf, offset, data.numel(), 0, chunk_crc)
        self.seq += 1
        self.in_round += 1
        self.wire_bytes += data.numel() + wire.FRAME_BYTES
        await self._send(wire.pack_frame(frame))

    def _write(self, stage: torch.Tensor, data: torch.Tensor, remote_ptr: int) -> None:
        stage.copy_(data)
        self.engine.write(self.peer, stage.data_ptr(), remote_ptr, data.numel())

    async def close(self) -> None:
        for t in getattr(self, "staging", []):
            self.engine.unregister(t)
        await super().close()
