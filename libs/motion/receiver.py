"""The TCP data plane's receiving end: the `DataPlane` an engine host runs.

Each connection must open with a live one-time token issued by `admit`; the
token is checked before anything else is read. Then the layout arrives, the
slot is opened (its declared shapes checked against their byte counts and the
admitted size before anything is allocated), and `frame_loop.receive_frames`
fills it. The sender gets one acknowledgement: the digest of the staged leaf
CRCs, or the reason for refusal.

Limits (`Limits`, from the engine host's `data_*` settings), each refusal counted in
`sf_dataplane_refused_total{reason}`:
- at most `max_connections` open at once; one more is answered "busy" and closed
  unread (reason `connections`);
- the hello (magic, token, layout) must arrive whole within `hello_timeout_s` of the
  connect, read on the event loop without a thread, so a silent or trickling peer
  costs a socket and nothing else (reason `hello_timeout`);
- mid-transfer, a sender silent for `idle_timeout_s` is gone (reason `idle`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import socket
from collections.abc import Callable
from dataclasses import dataclass

import msgspec
import structlog
import torch

from libs.errors import IntegrityError, StatefleetError, Timeout, Unauthorized
from libs.motion import manifest, mooncake, netio, shm, wire
from libs.motion.frame_loop import receive_frames
from libs.motion.slot import ShadowSlot
from libs.motion.stream import MAX_REASON_BYTES
from libs.schemas.base import decode
from libs.schemas.motion import Manifest
from libs.telemetry import counter

log = structlog.get_logger("statefleet.motion.receiver")
MAX_LAYOUT_BYTES = 64 << 20
_refused = counter("sf_dataplane_refused_total",
                   "Data-plane connections refused or dropped by a limit (connections, hello_timeout, idle)")


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    max_connections: int = 16
    hello_timeout_s: float = 10.0  # a connection that has not said who it is by then is dropped
    idle_timeout_s: float = 30.0  # a sender silent this long mid-transfer is gone


DEFAULT_LIMITS = Limits()

class DataPlane:
    """Accepts data connections; each must open with a live one-time token issued by `admit`."""

    def __init__(self, claim: Callable[[str], ShadowSlot], bind: str = "127.0.0.1:0", depth: int = 4,
                 mooncake_engine: mooncake.MooncakeEngine | None = None, limits: Limits = DEFAULT_LIMITS) -> None:
        self.claim, self.bind, self.depth, self.limits = claim, bind, depth, limits
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

    async def stop(self, grace_s: float = 0.0) -> None:
        """Close every connection; those still running first get `grace_s` to end on their own (a slot
        is `done` just before its acknowledgement is written, so a caller that stops on `done` waits)."""
        if grace_s > 0 and self._conns:
            await asyncio.wait(list(self._conns), timeout=grace_s)
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
            if len(self._conns) >= self.limits.max_connections:
                _refused.add(1, {"reason": "connections"})
                await asyncio.to_thread(_ack, conn, 1, 0, f"busy: {self.limits.max_connections} data connections "
                                                          "are open here; retry")
                conn.close()
                continue
            netio.tune(conn)
            conn.setblocking(False)  # the hello is read on the loop, under one deadline
            task = asyncio.create_task(self._serve(conn))
            self._conns.add(task)
            task.add_done_callback(self._conns.discard)

    async def _serve(self, conn: socket.socket) -> None:
        slot: ShadowSlot | None = None
        self._socks.add(conn)
        try:
            try:
                async with asyncio.timeout(self.limits.hello_timeout_s):
                    head = await _recv(conn, len(wire.MAGIC) + wire.TOKEN_BYTES)
                    if not hmac.compare_digest(head[:len(wire.MAGIC)], wire.MAGIC):
                        raise Unauthorized("not a data-plane hello")
                    slot = self.claim(head[len(wire.MAGIC):].hex())  # raises Unauthorized for a wrong/used token
                    layout, chunk_bytes, codec_id, flags = await self._hello(conn)
            except TimeoutError:
                _refused.add(1, {"reason": "hello_timeout"})
                raise Timeout(f"no complete hello within {self.limits.hello_timeout_s:g}s") from None
            # Socket reads run on threads from here on (see netio), each bounded by the idle timeout.
            conn.setblocking(True)
            conn.settimeout(self.limits.idle_timeout_s)
            try:
                await self._receive(conn, slot, layout, chunk_bytes, codec_id, flags)
            except TimeoutError:  # a blocking read timed out (frame_loop says so with a typed Timeout)
                _refused.add(1, {"reason": "idle"})
                raise Timeout(f"sender silent for {self.limits.idle_timeout_s:g}s mid-transfer") from None
        # RuntimeError: torch's, e.g. a device slot that does not fit in device memory (OutOfMemoryError) or
        # an IPC handle CUDA cannot open: the slot fails and the sender hears why, like any refusal.
        except (StatefleetError, OSError, msgspec.DecodeError, RuntimeError) as e:
            reason = getattr(e, "detail", None) or str(e) or type(e).__name__
            if slot is not None:
                slot.fail(reason)
            log.debug("data_connection_refused", reason=reason, move_id=slot.move_id if slot else "")
            await asyncio.to_thread(_ack, conn, 1, 0, reason)
        finally:
            self._socks.discard(conn)
            conn.close()

    async def _hello(self, conn: socket.socket) -> tuple[Manifest, int, int, int]:
        layout_len, chunk_bytes, codec_id, flags, _ = wire.HELLO.unpack(await _recv(conn, wire.HELLO.size))
        if layout_len > MAX_LAYOUT_BYTES:
            raise IntegrityError(f"layout of {layout_len} bytes is too large")
        return decode(await _recv(conn, layout_len), Manifest), chunk_bytes, codec_id, flags

    async def _receive(self, conn: socket.socket, slot: ShadowSlot, layout: Manifest, chunk_bytes: int,
                       codec_id: int, flags: int) -> None:
        slot.open(layout, chunk_bytes)  # shapes against byte counts and the admitted size, then allocation
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
                recv = functools.partial(asyncio.to_thread, netio.recv_bytes, conn)
                if offer.mode == "cuda_ipc":
                    handles = await shm.read_handles(recv)
                    sources = shm.open_sources(handles, layout)
                    pull = functools.partial(shm.pull_and_check, slot, sources, shm.copy_stream(slot, handles))
                elif plan := await shm.agree(recv, functools.partial(asyncio.to_thread, conn.sendall), slot, layout):
                    pull = functools.partial(shm.pull_host, slot, plan)
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


async def _recv(conn: socket.socket, n: int) -> bytes:
    """Exactly n bytes from a non-blocking socket, on the event loop; a peer that hangs up first is refused."""
    buf = bytearray(n)
    view, got, loop = memoryview(buf), 0, asyncio.get_running_loop()
    while got < n:
        k = await loop.sock_recv_into(conn, view[got:])
        if k == 0:
            raise IntegrityError(f"connection closed after {got} of {n} bytes")
        got += k
    return bytes(buf)


def _ack(conn: socket.socket, status: int, digest: int, reason: str) -> None:
    body = reason.encode()[:MAX_REASON_BYTES]
    try:
        conn.settimeout(1.0)
        conn.sendall(wire.ACK.pack(status, digest, len(body)) + body)
    except OSError:
        pass  # the sender is gone; its side fails on its own
