"""The TCP data-plane framing: a hello with the one-time token, then checksummed chunk frames.

    hello  = MAGIC(8) token(16) | layout_len u32, chunk_bytes u32, codec u8, flags u8, pad u16 | layout
    frame  = kind u8, codec u8, pad u16, seq u32, leaf u32, offset u64, length u32, wire_len u32,
             crc u32 (of the decoded bytes), header_crc u32 (of everything before it) | payload
    ack    = status u8, pad 3, digest u32, reason_len u32 | reason

The token is checked before anything else is read. Chunk `seq` rises by one per
frame; an end-of-round frame carries the count of chunk frames in its round, so
a dropped, extra or reordered frame is caught by the receiver.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from libs.errors import IntegrityError
from libs.motion import crc

MAGIC = b"SFMOVE01"
TOKEN_BYTES = 16
HELLO = struct.Struct("<IIBBH")
FRAME = struct.Struct("<BBHIIQIII")
HEADER_CRC = struct.Struct("<I")
ACK = struct.Struct("<B3xII")
FRAME_BYTES = FRAME.size + HEADER_CRC.size

DATA, END_ROUND, DONE = 0, 1, 2
FLAG_PLANES, FLAG_UNVERIFIED = 1, 2  # hello flags: bf16/fp16 byte planes; no per-chunk CRC (bench baseline)
CODECS = {"none": 0, "zstd": 1, "lz4": 2, "mooncake": 3, "shm": 4}  # mooncake, shm: bytes moved out of band
CODEC_NAMES = {v: k for k, v in CODECS.items()}


@dataclass(frozen=True, slots=True)
class Frame:
    kind: int
    codec: int
    seq: int
    leaf: int
    offset: int
    length: int
    wire_len: int
    crc: int


def pack_hello(token: str, layout: bytes, chunk_bytes: int, codec: str, byte_planes: bool,
               verify_chunks: bool) -> bytes:
    flags = (FLAG_PLANES if byte_planes else 0) | (0 if verify_chunks else FLAG_UNVERIFIED)
    return MAGIC + bytes.fromhex(token) + HELLO.pack(len(layout), chunk_bytes, CODECS[codec], flags, 0) + layout


def pack_frame(f: Frame) -> bytes:
    head = FRAME.pack(f.kind, f.codec, 0, f.seq, f.leaf, f.offset, f.length, f.wire_len, f.crc)
    return head + HEADER_CRC.pack(crc.crc(head))


def unpack_frame(buf: bytes) -> Frame:
    head, (got,) = buf[:FRAME.size], HEADER_CRC.unpack(buf[FRAME.size:])
    if crc.crc(head) != got:
        raise IntegrityError("chunk header fails its CRC")
    kind, codec, _, seq, leaf, offset, length, wire_len, c = FRAME.unpack(head)
    if kind not in (DATA, END_ROUND, DONE) or codec not in CODEC_NAMES:
        raise IntegrityError(f"unknown frame kind {kind} or codec {codec}")
    return Frame(kind, codec, seq, leaf, offset, length, wire_len, c)
