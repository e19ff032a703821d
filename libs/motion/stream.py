"""The sender's side of the TCP control stream: hello, numbered chunk frames, round ends, the ack.

Every channel that talks to a `DataPlane` (TCP with payloads inline, Mooncake
with bytes out of band) writes its frames through one `FrameStream`, so the
sequence numbers and per-round counts the receiver checks are kept in one place.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket

from libs.errors import IntegrityError, Unavailable
from libs.motion import netio, wire
from libs.schemas.base import encode
from libs.schemas.motion import Manifest

MAX_REASON_BYTES = 4096


class FrameStream:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.seq = 0
        self.in_round = 0
        self.wire_bytes = 0

    @classmethod
    async def open(cls, dest_addr: str, token: str, layout: Manifest, chunk_bytes: int, *, codec: str,
                   byte_planes: bool = False, verify_chunks: bool = True, timeout_s: float = 10.0) -> FrameStream:
        stream = cls(await netio.connect(dest_addr, timeout_s))
        await stream.send(wire.pack_hello(token, encode(layout), chunk_bytes, codec, byte_planes, verify_chunks))
        return stream

    def data_frame(self, codec: int, leaf: int, offset: int, length: int, wire_len: int, chunk_crc: int, *,
                   moved: int | None = None) -> bytes:
        """The next chunk's frame, numbered and counted into this round. `moved`: the chunk's bytes
        carried by any path (default `wire_len`, the payload that follows the frame on this stream)."""
        frame = wire.pack_frame(wire.Frame(wire.DATA, codec, self.seq, leaf, offset, length, wire_len, chunk_crc))
        self.seq += 1
        self.in_round += 1
        self.wire_bytes += (wire_len if moved is None else moved) + wire.FRAME_BYTES
        return frame

    async def send(self, *parts: bytes | memoryview) -> None:
        try:
            await asyncio.to_thread(self.send_blocking, *parts)
        except OSError as e:
            raise Unavailable(f"data plane connection lost: {e}") from None

    def send_blocking(self, *parts: bytes | memoryview) -> None:
        """For a caller already on a thread; raises OSError as the socket does."""
        for part in parts:
            self.sock.sendall(part)

    async def recv(self, n: int) -> bytes:
        return await asyncio.to_thread(netio.recv_bytes, self.sock, n)

    async def end_round(self) -> None:
        await self.send(wire.pack_frame(wire.Frame(wire.END_ROUND, 0, self.seq, self.in_round, 0, 0, 0, 0)))
        self.seq += 1
        self.in_round = 0

    async def finish(self) -> int:
        """End the last round, say DONE, and read the receiver's verdict: its digest, or why it refused."""
        await self.end_round()
        await self.send(wire.pack_frame(wire.Frame(wire.DONE, 0, self.seq, 0, 0, 0, 0, 0)))
        try:
            status, digest, reason_len = wire.ACK.unpack(await self.recv(wire.ACK.size))
            reason = (await self.recv(min(reason_len, MAX_REASON_BYTES))).decode(errors="replace")
        except (OSError, IntegrityError) as e:
            raise Unavailable(f"no acknowledgement from the receiver: {e}") from None
        if status != 0:
            raise IntegrityError(f"receiver refused the state: {reason}")
        return digest

    async def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)  # unblocks a send still running on its thread
        self.sock.close()
