"""The TCP data plane's receiving end: the `DataPlane` an engine host runs.

Each connection must open with a live one-time token issued by `admit`; the
token is checked before anything else is read. Then the layout arrives, the
slot is opened, and `frame_loop.receive_frames` fills it. The sender gets one
acknowledgement: the digest of the staged leaf CRCs, or the reason for refusal.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import socket
from collections.abc import Callable

import msgspec
import structlog
import torch

from libs.errors import IntegrityError, StatefleetError, Unauthorized
from libs.motion import manifest, mooncake, netio, shm, wire
from libs.motion.frame_loop import receive_frames
from libs.motion.slot import ShadowSlot
from libs.motion.stream import MAX_REASON_BYTES
from libs.schemas.base import decode
from libs.schemas.motion import Manifest

log = structlog.get_logger("statefleet.motion.receiver")
MAX_LAYOUT_BYTES = 64 << 20
HELLO_TIMEOUT_S = 10.0  # a connection that has not said who it is by then is dropped
IDLE_TIMEOUT_S = 30.0  # a sender silent this long mid-transfer is gone


class DataPlane:
    """Accepts data connections; each must open with a live one-time token issued by `admit`."""

    def __init__(self, claim: Callable[[str], ShadowSlot], bind: str = "127.0.0.1:0", depth: int = 4,
                 mooncake_engine: mooncake.MooncakeEngine | None = None) -> None:
        self.claim, self.bind, self.depth = claim, bind, depth
        self.mooncake = mooncake_engine  # where one runs, senders may ask for out-of-band bytes
        self.sock: socket.socket | None = None
        self.addr = ""
        self._accept_task: asyncio.Task | None = None
        self._conns: set[asyncio.Task] = set()
        self._socks: set[socket.socket] = set()

    async def start(self) -> str:
        self.sock, self.addr = netio.listen(self.bind)
        self._accept_task = asyncio.create_task(self._accept_loop(), name="dataplane-accept")
        return self.addr

    async def stop(self) -> None:
        for conn in list(self._socks):  # unblocks any reader thread
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        tasks = [t for t in (self._accept_task, *self._conns) if t]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self.sock:
            self.sock.close()

    async def _accept_loop(self) -> None:
        loop = asyncio.get_running_loop()
        assert self.sock is not None
        while True:
            conn, _ = await loop.sock_accept(self.sock)
            netio.tune(conn)
            # Socket reads run on threads from here on (see netio), bounded by a timeout.
            conn.setblocking(True)
            conn.settimeout(HELLO_TIMEOUT_S)
            task = asyncio.create_task(self._serve(conn))
            self._conns.add(task)
            task.add_done_callback(self._conns.discard)

    async def _serve(self, conn: socket.socket) -> None:
        slot: ShadowSlot | None = None
        self._socks.add(conn)
        try:
            head = await asyncio.to_thread(netio.recv_bytes, conn, len(wire.MAGIC) + wire.TOKEN_BYTES)
            if not hmac.compare_digest(head[:len(wire.MAGIC)], wire.MAGIC):
                raise Unauthorized("not a data-plane hello")
            slot = self.claim(head[len(wire.MAGIC):].hex())  # raises Unauthorized for a wrong/used token
            await self._receive(conn, slot)
        except (StatefleetError, OSError, msgspec.DecodeError) as e:
            reason = getattr(e, "detail", None) or str(e) or type(e).__name__
            if slot is not None:
                slot.fail(reason)
            log.debug("data_connection_refused", reason=reason, move_id=slot.move_id if slot else "")
            await asyncio.to_thread(_ack, conn, 1, 0, reason)
        finally:
            self._socks.discard(conn)
            conn.close()

    async def _receive(self, conn: socket.socket, slot: ShadowSlot) -> None:
        layout_len, chunk_bytes, codec_id, flags, _ = wire.HELLO.unpack(
            await asyncio.to_thread(netio.recv_bytes, conn, wire.HELLO.size))
        if layout_len > MAX_LAYOUT_BYTES:
            raise IntegrityError(f"layout of {layout_len} bytes is too large")
        layout = decode(await asyncio.to_thread(netio.recv_bytes, conn, layout_len), Manifest)
        slot.open(layout, chunk_bytes)
        itemsizes = [manifest.dtype_of(x.dtype).itemsize for x in layout.leaves]
        kind = wire.CODEC_NAMES.get(codec_id)
        registered: list[torch.Tensor] = []
        sources: list[torch.Tensor] = []
        pull = None
        try:
            if kind == "mooncake":
                registered, ready = mooncake.offer(self.mooncake, slot)
                await asyncio.to_thread(conn.sendall, ready)
            elif kind == "shm":
                offer = shm.ready_for(slot)
                await asyncio.to_thread(conn.sendall, shm.message(offer))
                if offer.mode == "cuda_ipc":
                    sources = shm.open_sources(
                        await shm.read_handles(lambda n: asyncio.to_thread(netio.recv_bytes, conn, n)), layout)
                    pull = functools.partial(shm.pull_and_check, slot, sources, torch.cuda.Stream(slot.device))
            conn.settimeout(IDLE_TIMEOUT_S)
            oob = codec_id if kind in ("mooncake", "shm") else None
            await asyncio.to_thread(receive_frames, conn, slot, flags, itemsizes, oob, self.depth, pull)
            if kind == "shm":
                shm.settle(slot)
        finally:
            if registered:
                mooncake.withdraw(self.mooncake, registered)
            sources.clear()  # drops the IPC mappings of the sender's memory
        digest = slot.finish()
        await asyncio.to_thread(_ack, conn, 0, digest, "")


def _ack(conn: socket.socket, status: int, digest: int, reason: str) -> None:
    body = reason.encode()[:MAX_REASON_BYTES]
    try:
        conn.settimeout(1.0)
        conn.sendall(wire.ACK.pack(status, digest, len(body)) + body)
    except OSError:
        pass  # the sender is gone; its side fails on its own
