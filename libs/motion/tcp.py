"""The TCP sender: chunks go inline on the control stream, encoded by the move's wire codec.

A whole round is sent from one thread: up to PREFETCH chunks are read,
checksummed and encoded ahead on the worker pool, and each frame is written as
soon as its chunk is ready, with no event-loop hop per chunk. The receiving
end is `libs.motion.receiver.DataPlane`.
"""

from __future__ import annotations

import asyncio
import functools

import numpy as np
import torch

from libs.errors import Unavailable
from libs.motion import codec as wirecodec
from libs.motion import crc, manifest, wire
from libs.motion.prefetch import Prefetch
from libs.motion.stream import FrameStream
from libs.motion.transport import Channel, Chunk, read_chunk
from libs.schemas.motion import Manifest


class TcpChannel(Channel):
    def __init__(self, stream: FrameStream, codec: str, byte_planes: bool, itemsizes: list[int]) -> None:
        self.stream, self.codec, self.byte_planes, self.itemsizes = stream, codec, byte_planes, itemsizes
        self.codec_id = wire.CODECS[codec]

    @classmethod
    async def open(cls, dest_addr: str, token: str, layout: Manifest, chunk_bytes: int, *,
                   codec: str = "none", byte_planes: bool = False, verify_chunks: bool = True,
                   timeout_s: float = 10.0) -> TcpChannel:
        """`verify_chunks=False` exists for the benchmark's verify-off baseline only: the receiver then
        skips per-chunk CRCs, its digest is meaningless and nothing it stages can pass `verify`."""
        stream = await FrameStream.open(dest_addr, token, layout, chunk_bytes, codec=codec, byte_planes=byte_planes,
                                        verify_chunks=verify_chunks, timeout_s=timeout_s)
        return cls(stream, codec, byte_planes, [manifest.dtype_of(x.dtype).itemsize for x in layout.leaves])

    @property
    def wire_bytes(self) -> int:
        return self.stream.wire_bytes

    def encode(self, leaf: int, arr: np.ndarray) -> memoryview:
        """The chunk's bytes as they go on the wire: as they are, or compressed by the move's codec."""
        if self.codec == "none":
            return memoryview(arr).cast("B")
        planes = wirecodec.planes_for(self.itemsizes[leaf], self.byte_planes)
        return memoryview(wirecodec.encode(self.codec, arr, planes))

    async def put(self, leaf: int, offset: int, data: torch.Tensor, chunk_crc: int) -> None:
        arr = data.cpu().numpy()
        if self.codec == "none":
            payload = self.encode(leaf, arr)
        else:
            payload = await asyncio.get_running_loop().run_in_executor(crc.pool, self.encode, leaf, arr)
        frame = self.stream.data_frame(self.codec_id, leaf, offset, arr.nbytes, len(payload), chunk_crc)
        await self.stream.send(frame, payload)

    async def put_many(self, views: list[torch.Tensor], chunks: list[Chunk], *, bounce: bool,
                       checksum: bool = True) -> list[int]:
        try:
            return await asyncio.to_thread(self._send_round, views, chunks, bounce, checksum)
        except OSError as e:
            raise Unavailable(f"data plane connection lost: {e}") from None

    def _prepare(self, views: list[torch.Tensor], c: Chunk, bounce: bool, checksum: bool) -> tuple[memoryview, int]:
        data, value = read_chunk(views, c, bounce=bounce, checksum=checksum, to_host=True)
        return self.encode(c[0], data.numpy()), value

    def _send_round(self, views: list[torch.Tensor], chunks: list[Chunk], bounce: bool, checksum: bool) -> list[int]:
        prepare = functools.partial(self._prepare, views, bounce=bounce, checksum=checksum)
        out: list[int] = []
        with Prefetch(prepare, chunks) as ahead:
            for (leaf, off, n), job in zip(chunks, ahead, strict=True):
                payload, value = job.result()
                self.stream.send_blocking(self.stream.data_frame(self.codec_id, leaf, off, n, len(payload), value),
                                          payload)
                out.append(value)
        return out

    async def end_round(self) -> None:
        await self.stream.end_round()

    async def finish(self) -> int:
        return await self.stream.finish()

    async def close(self) -> None:
        await self.stream.close()
