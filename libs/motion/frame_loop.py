"""The receiver's frame loop: read chunk frames into the slot until DONE, every chunk checked.

It runs on one thread with blocking socket reads. An uncompressed chunk for a
host slot is read straight into the staged tensor (one syscall, no buffer in
between); a compressed chunk, or any chunk for a device slot, is read into a
buffer and decoded (or staged through host) on the worker pool. Either way the
CRC is taken over the slot's own memory. At most `depth` chunks are being
checked at once, so memory stays bounded whatever the state size.
"""

from __future__ import annotations

import socket
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future

import numpy as np
import torch

from libs.errors import IntegrityError, Timeout
from libs.motion import codec as wirecodec
from libs.motion import crc, netio, wire
from libs.motion.checked_copy import check_staged, copy_and_check
from libs.motion.slot import ShadowSlot

MAX_EXPANSION = 2  # a compressed payload larger than twice its chunk (plus slack) is refused unread


def receive_frames(conn: socket.socket, slot: ShadowSlot, flags: int, itemsizes: list[int], out_of_band: int | None,
                   depth: int, pull: Callable[[wire.Frame, torch.Tensor], None] | None = None) -> None:
    """Read frames until DONE with every chunk checked; raise on the first thing that is wrong.

    `out_of_band`: the codec whose chunks arrive by another path (Mooncake, shared memory), their frames
    without payload; `pull`: for those, fetch the chunk into its region and check it (CUDA IPC, or a read
    of a frozen host sender's memory), where the sender did not write it in place."""
    checks: deque[Future] = deque()
    seq, in_round = 0, 0
    try:
        while True:
            f = wire.unpack_frame(netio.recv_bytes(conn, wire.FRAME_BYTES))
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
            if wire.CODEC_NAMES[f.codec] in ("mooncake", "shm"):
                if f.codec != out_of_band or f.wire_len != 0:
                    raise IntegrityError("out-of-band chunk on a connection that did not offer it")
                job = (check_staged, slot, f.leaf, f.offset, region, f.crc) if pull is None else (pull, f, region)
            elif f.codec == 0 and f.wire_len != f.length:
                raise IntegrityError("uncompressed chunk with wire length != length")
            elif f.codec == 0 and region.device.type == "cpu":
                netio.recv_into(conn, memoryview(region.numpy()))
                if flags & wire.FLAG_UNVERIFIED:
                    slot.record(f.leaf, f.offset, 0)
                    continue
                job = (check_staged, slot, f.leaf, f.offset, region, f.crc)
            else:
                if f.wire_len > MAX_EXPANSION * f.length + 1024:
                    raise IntegrityError(f"compressed chunk of {f.wire_len} bytes for {f.length}")
                payload = bytearray(f.wire_len)  # writable: the worker hands it to torch as it is
                netio.recv_into(conn, memoryview(payload))
                planes = wirecodec.planes_for(itemsizes[f.leaf], bool(flags & wire.FLAG_PLANES))
                job = (decode_and_check, slot, f, payload, planes)
            if len(checks) >= depth:
                checks.popleft().result()
            checks.append(crc.pool.submit(*job))
    except TimeoutError:
        raise Timeout(f"sender went quiet for {conn.gettimeout()}s") from None
    finally:
        for c in checks:
            c.cancel()


def decode_and_check(slot: ShadowSlot, f: wire.Frame, payload: bytearray, planes: int) -> None:
    """Decode (or, for a device slot, stage through host) and check the chunk in a worker thread."""
    if f.codec == 0:
        out = np.frombuffer(payload, dtype=np.uint8)
    else:
        out = np.empty(f.length, dtype=np.uint8)
        wirecodec.decode_into(wire.CODEC_NAMES[f.codec], memoryview(payload), out, planes)
    copy_and_check(slot, f.leaf, f.offset, torch.from_numpy(out), f.crc)
