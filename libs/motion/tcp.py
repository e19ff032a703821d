"""The TCP data plane: a sender `TcpChannel` and the `DataPlane` receiver an engine host runs.

Memory stays bounded whatever the state size: uncompressed chunks are received
straight into the slot's staged tensors, and at most `depth` chunks are being
checksummed (or decoded) at once. CRCs run on the worker pool while the next
chunk is on the wire.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import socket
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future

import msgspec
import numpy as np
import structlog
import torch

from libs.errors import IntegrityError, StatefleetError, Unauthorized, Unavailable
from libs.motion import codec as wirecodec
from libs.motion import crc, wire
from libs.motion.slot import ShadowSlot
from libs.motion.transport import copy_and_check
from libs.schemas.base import decode, encode
from libs.schemas.motion import Manifest

log = structlog.get_logger("statefleet.motion.tcp")
MAX_LAYOUT_BYTES = 64 << 20
IDLE_TIMEOUT_S = 30.0
PREFETCH = 4  # chunks checksummed (and encoded) ahead of the one on the wire  # a sender silent this long mid-transfer is gone
SOCK_BUF = 4 << 20


def tune(sock: socket.socket) -> None:
    """No Nagle, 4 MiB socket buffers: what every data-plane socket (and the bench's raw baseline) uses."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        sock.setsockopt(socket.SOL_SOCKET, opt, SOCK_BUF)


def split_addr(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    return host.strip("[]"), int(port)


async def recv_exactly(loop: asyncio.AbstractEventLoop, sock: socket.socket, view: memoryview) -> None:
    got = 0
    while got < len(view):
        n = await loop.sock_recv_into(sock, view[got:])
        if n == 0:
            raise IntegrityError(f"connection closed after {got} of {len(view)} bytes")
        got += n


async def recv_bytes(loop: asyncio.AbstractEventLoop, sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    await recv_exactly(loop, sock, memoryview(buf))
    return bytes(buf)


# ---------------------------------------------------------------- sender


class TcpChannel:
    def __init__(self, sock: socket.socket, codec: str, byte_planes: bool, itemsizes: list[int]) -> None:
        self.sock, self.codec, self.byte_planes, self.itemsizes = sock, codec, byte_planes, itemsizes
        self.loop = asyncio.get_running_loop()
        self.seq = 0
        self.in_round = 0
        self.wire_bytes = 0

    @classmethod
    async def open(cls, dest_addr: str, token: str, layout: Manifest, chunk_bytes: int, *,
                   codec: str = "none", byte_planes: bool = False, verify_chunks: bool = True,
                   timeout_s: float = 10.0) -> TcpChannel:
        """`verify_chunks=False` exists for the benchmark's verify-off baseline only: the receiver then
        skips per-chunk CRCs, its digest is meaningless and nothing it stages can pass `verify`."""
        host, port = split_addr(dest_addr)
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        tune(sock)
        try:
            await asyncio.wait_for(asyncio.get_running_loop().sock_connect(sock, (host, port)), timeout_s)
        except (OSError, TimeoutError) as e:
            sock.close()
            raise Unavailable(f"cannot reach data plane {dest_addr}: {e}", addr=dest_addr) from None
        body = encode(layout)
        hello = wire.MAGIC + bytes.fromhex(token) + wire.HELLO.pack(len(body), chunk_bytes, wire.CODECS[codec],
                                                                    _flags(byte_planes, verify_chunks), 0) + body
        sock.setblocking(True)  # from here on, socket I/O runs on threads
        ch = cls(sock, codec, byte_planes, [manifest_itemsize(x.dtype) for x in layout.leaves])
        await ch._send(hello)
        return ch

    async def _send(self, data) -> None:
        try:
            await asyncio.to_thread(self.sock.sendall, data)
        except OSError as e:
            raise Unavailable(f"data plane connection lost: {e}") from None

    async def put(self, leaf: int, offset: int, data: torch.Tensor, chunk_crc: int) -> None:
        arr = data.numpy() if data.device.type == "cpu" else data.cpu().numpy()
        if self.codec == "none":
            payload = memoryview(arr)
        else:
            planes = wirecodec.planes_for(self.itemsizes[leaf], self.byte_planes)
            payload = memoryview(await self.loop.run_in_executor(crc.pool, wirecodec.encode, self.codec, arr, planes))
        frame = wire.Frame(wire.DATA, wire.CODECS[self.codec], self.seq, leaf, offset, arr.nbytes, len(payload),
                           chunk_crc)
        self.seq += 1
        self.in_round += 1
        self.wire_bytes += len(payload) + wire.FRAME_BYTES
        await self._send(wire.pack_frame(frame))
        await self._send(payload)

    async def put_many(self, views: list[torch.Tensor], chunks: list[tuple[int, int, int]], bounce: bool,
                       checksum: bool = True) -> list[int]:
        """Send a whole round from one thread: CRC (and encode) up to PREFETCH chunks ahead on the
        worker pool, write each frame as soon as its chunk is ready; no event-loop hop per chunk."""
        try:
            return await asyncio.to_thread(self._send_round, views, chunks, bounce, checksum)
        except OSError as e:
            raise Unavailable(f"data plane connection lost: {e}") from None

    def _prepare(self, views: list[torch.Tensor], c: tuple[int, int, int], bounce: bool, checksum: bool):
        leaf, off, n = c
        data = views[leaf][off:off + n]
        if bounce or data.device.type != "cpu":
            data = data.to("cpu", copy=True)
        arr = data.numpy()
        value = crc.crc(arr) if checksum else 0
        if self.codec == "none":
            return arr, value
        planes = wirecodec.planes_for(self.itemsizes[leaf], self.byte_planes)
        return wirecodec.encode(self.codec, arr, planes), value

    def _send_round(self, views, chunks, bounce: bool, checksum: bool) -> list[int]:
        pending: deque[Future] = deque()
        out: list[int] = []
        nxt = 0
        try:
            for leaf, off, n in chunks:
                while nxt < len(chunks) and len(pending) < PREFETCH:
                    pending.append(crc.pool.submit(self._prepare, views, chunks[nxt], bounce, checksum))
                    nxt += 1
                payload, value = pending.popleft().result()
                wire_len = len(memoryview(payload).cast("B"))
                frame = wire.Frame(wire.DATA, wire.CODECS[self.codec], self.seq, leaf, off, n, wire_len, value)
                self.sock.sendall(wire.pack_frame(frame))
                self.sock.sendall(payload)
                self.seq += 1
                self.in_round += 1
                self.wire_bytes += wire_len + wire.FRAME_BYTES
                out.append(value)
        finally:
            for f in pending:
                f.cancel()
        return out

    async def end_round(self) -> None:
        await self._send(wire.pack_frame(wire.Frame(wire.END_ROUND, 0, self.seq, self.in_round, 0, 0, 0, 0)))
        self.seq += 1
        self.in_round = 0

    async def finish(self) -> int:
        await self.end_round()
        await self._send(wire.pack_frame(wire.Frame(wire.DONE, 0, self.seq, 0, 0, 0, 0, 0)))
        try:
            status, digest, reason_len = wire.ACK.unpack(await asyncio.to_thread(recv_blocking, self.sock,
                                                                                 wire.ACK.size))
            reason = (await asyncio.to_thread(recv_blocking, self.sock, min(reason_len, 4096))).decode(
                errors="replace")
        except (OSError, IntegrityError) as e:
            raise Unavailable(f"no acknowledgement from the receiver: {e}") from None
        if status != 0:
            raise IntegrityError(f"receiver refused the state: {reason}")
        return digest

    async def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)  # unblocks a send still running on its thread
        self.sock.close()


def _flags(byte_planes: bool, verify_chunks: bool) -> int:
    return (wire.FLAG_PLANES if byte_planes else 0) | (0 if verify_chunks else wire.FLAG_UNVERIFIED)


def manifest_itemsize(dtype: str) -> int:
    return getattr(torch, dtype).itemsize


# ---------------------------------------------------------------- receiver


class DataPlane:
    """Accepts data connections; each must open with a live one-time token issued by `admit`."""

    def __init__(self, claim: Callable[[str], ShadowSlot], bind: str = "127.0.0.1:0", depth: int = 4,
                 mooncake=None) -> None:
        self.claim, self.bind, self.depth = claim, bind, depth
        self.mooncake = mooncake  # a libs.motion.mooncake.MooncakeEngine, where one runs
        self.sock: socket.socket | None = None
        self.addr = ""
        self._accept_task: asyncio.Task | None = None
        self._conns: set[asyncio.Task] = set()
        self._socks: set[socket.socket] = set()

    async def start(self) -> str:
        host, port = split_addr(self.bind)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(64)
        sock.setblocking(False)
        self.sock = sock
        bound = sock.getsockname()
        self.addr = f"[{bound[0]}]:{bound[1]}" if family == socket.AF_INET6 else f"{bound[0]}:{bound[1]}"
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
            conn.setblocking(False)
            tune(conn)
            task = asyncio.create_task(self._serve(conn))
            self._conns.add(task)
            task.add_done_callback(self._conns.discard)

    async def _serve(self, conn: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        slot: ShadowSlot | None = None
        self._socks.add(conn)
        try:
            head = await recv_bytes(loop, conn, len(wire.MAGIC) + wire.TOKEN_BYTES)
            if not hmac.compare_digest(head[:len(wire.MAGIC)], wire.MAGIC):
                raise Unauthorized("not a data-plane hello")
            slot = self.claim(head[len(wire.MAGIC):].hex())  # raises Unauthorized for a wrong/used token
            await self._receive(loop, conn, slot)
        except (StatefleetError, OSError, msgspec.DecodeError) as e:
            reason = getattr(e, "detail", None) or str(e) or type(e).__name__
            if slot is not None:
                slot.fail(reason)
            log.debug("data_connection_refused", reason=reason, move_id=slot.move_id if slot else "")
            await asyncio.to_thread(_ack_blocking, conn, 1, 0, reason)
        finally:
            self._socks.discard(conn)
            conn.close()

    async def _receive(self, loop, conn: socket.socket, slot: ShadowSlot) -> None:
        layout_len, chunk_bytes, codec_id, flags, _ = wire.HELLO.unpack(
            await recv_bytes(loop, conn, wire.HELLO.size))
        if layout_len > MAX_LAYOUT_BYTES:
            raise IntegrityError(f"layout of {layout_len} bytes is too large")
        layout = decode(await recv_bytes(loop, conn, layout_len), Manifest)
        slot.open(layout, chunk_bytes)
        itemsizes = [manifest_itemsize(x.dtype) for x in layout.leaves]
        registered = self._offer_mooncake(slot) if wire.CODEC_NAMES.get(codec_id) == "mooncake" else []
        if registered:
            from libs.motion.mooncake import ready_message

            await loop.sock_sendall(conn, ready_message(self.mooncake, registered))
        try:
            conn.setblocking(True)
            conn.settimeout(IDLE_TIMEOUT_S)
            # The frame loop runs on a thread with blocking socket reads: one syscall per chunk
            # straight into the staged tensor, while CRCs run on the worker pool.
            await asyncio.to_thread(self._frames, conn, slot, flags, itemsizes, bool(registered))
        finally:
            for t in registered:
                self.mooncake.unregister(t)
        digest = slot.finish()
        await asyncio.to_thread(_ack_blocking, conn, 0, digest, "")

    def _frames(self, conn: socket.socket, slot: ShadowSlot, flags: int, itemsizes: list[int],
                out_of_band: bool) -> None:
        """Read frames until DONE with every chunk checked; raise on the first thing that is wrong."""
        checks: deque[Future] = deque()
        seq, in_round = 0, 0
        try:
            while True:
                f = wire.unpack_frame(recv_blocking(conn, wire.FRAME_BYTES))
                if f.seq != seq:
                    raise IntegrityError(f"frame {f.seq} arrived where {seq} was due (reordered or lost)")
                seq += 1
                if f.kind == wire.END_ROUND:
                    if f.leaf != in_round:
                        raise IntegrityError(f"round had {in_round} chunks, sender says {f.leaf}")
                    in_round = 0
                    continue
                if f.kind == wire.DONE:
                    while checks:
                        checks.popleft().result()
                    return
                in_round += 1
                region = slot.region(f.leaf, f.offset, f.length)
                if wire.CODEC_NAMES[f.codec] == "mooncake":
                    if not out_of_band or f.wire_len != 0:
                        raise IntegrityError("out-of-band chunk on a connection that did not offer it")
                    job = (_check_staged, slot, f.leaf, f.offset, region, f.crc)
                elif f.codec == 0 and f.wire_len != f.length:
                    raise IntegrityError("uncompressed chunk with wire length != length")
                elif f.codec == 0 and region.device.type == "cpu":
                    # Straight into the staged tensor: no buffer between the socket and the slot.
                    recv_into_blocking(conn, memoryview(region.numpy()))
                    if flags & wire.FLAG_UNVERIFIED:
                        slot.record(f.leaf, f.offset, 0)
                        continue
                    job = (_check_staged, slot, f.leaf, f.offset, region, f.crc)
                else:
                    if f.wire_len > 2 * f.length + 1024:
                        raise IntegrityError(f"compressed chunk of {f.wire_len} bytes for {f.length}")
                    payload = recv_blocking(conn, f.wire_len)
                    planes = wirecodec.planes_for(itemsizes[f.leaf], bool(flags & wire.FLAG_PLANES))
                    job = (_decode_and_check, slot, f, payload, planes)
                if len(checks) >= self.depth:
                    checks.popleft().result()
                checks.append(crc.pool.submit(*job))
        except TimeoutError:
            raise IntegrityError(f"sender went quiet for {IDLE_TIMEOUT_S}s") from None
        finally:
            for c in checks:
                c.cancel()

    def _offer_mooncake(self, slot: ShadowSlot) -> list[torch.Tensor]:
        if self.mooncake is None or slot.device.type != "cpu":
            raise IntegrityError("this receiver offers no mooncake transfer for this slot")
        for t in slot.flats:
            self.mooncake.register(t)
        return list(slot.flats)


def _check_staged(slot: ShadowSlot, leaf: int, offset: int, region: torch.Tensor, chunk_crc: int) -> None:
    staged = crc.crc_bytes(region)
    if staged != chunk_crc:
        raise IntegrityError(f"chunk at leaf {leaf} offset {offset}: CRC {staged:#x} != {chunk_crc:#x}")
    slot.record(leaf, offset, staged)


def _decode_and_check(slot: ShadowSlot, f: wire.Frame, payload: bytes, planes: int) -> None:
    """Decode (or, for a device slot, stage through host) and check the chunk in a worker thread."""
    if f.codec == 0:
        out = np.frombuffer(payload, dtype=np.uint8)
    else:
        out = np.empty(f.length, dtype=np.uint8)
        wirecodec.decode_into(wire.CODEC_NAMES[f.codec], memoryview(payload), out, planes)
    copy_and_check(slot, f.leaf, f.offset, torch.from_numpy(out), f.crc)


def _ack_blocking(conn: socket.socket, status: int, digest: int, reason: str) -> None:
    body = reason.encode()[:4096]
    try:
        conn.setblocking(True)
        conn.settimeout(1.0)
        conn.sendall(wire.ACK.pack(status, digest, len(body)) + body)
    except OSError:
        pass  # the sender is gone; its side fails on its own


def recv_into_blocking(conn: socket.socket, view: memoryview) -> None:
    got = 0
    while got < len(view):
        n = conn.recv_into(view[got:])
        if n == 0:
            raise IntegrityError(f"connection closed after {got} of {len(view)} bytes")
        got += n


def recv_blocking(conn: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    recv_into_blocking(conn, memoryview(buf))
    return bytes(buf)
