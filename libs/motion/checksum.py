"""Which fingerprint a move's chunks and leaves carry: CRC32C, or the device fingerprint between GPUs.

A manifest names its kind (`Manifest.checksum`) and its leaves' `crc32c` fields hold values of that
kind. CRC32C is the rule. A move whose bytes go device to device (CUDA IPC, or in-process between GPUs)
is fingerprinted on the devices instead (`libs.motion.devhash`), where its chunks lie on the
fingerprint's blocks: a CRC32C of device memory stages every byte through host memory on both sides,
which runs at a few hundredths of the device copy it would verify.
"""

from __future__ import annotations

import torch

from libs.motion import crc, devhash

CRC32C, DEVHASH = "crc32c", "devhash64"
KINDS = (CRC32C, DEVHASH)


def for_device_move(chunk_bytes: int) -> str:
    """The kind a move between CUDA devices with chunks of `chunk_bytes` uses (both sides decide alike)."""
    return DEVHASH if chunk_bytes % devhash.BLOCK_BYTES == 0 else CRC32C


def of_bytes(kind: str, flat: torch.Tensor, start_byte: int) -> int:
    """The fingerprint of flat uint8 bytes lying `start_byte` bytes into their leaf."""
    return devhash.fingerprint(flat, start_byte) if kind == DEVHASH else crc.crc_bytes(flat)


def on_wire(kind: str, value: int) -> int:
    """The 32 bits of a chunk's value its frame carries (the whole value is bound at the leaves)."""
    return devhash.fold(value) if kind == DEVHASH else value


def combine(kind: str, values: list[int], lengths: list[int]) -> int:
    """A leaf's fingerprint from those of its consecutive chunks, of `lengths` bytes."""
    return devhash.combine(values) if kind == DEVHASH else crc.combine_all(values, lengths)
