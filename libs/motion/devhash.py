"""A fingerprint of device memory computed on the device: one 8-byte value comes back, never the bytes.

h = Σ x_i · (2A·i + 2B + 1) mod 2^64 over the memory's 32-bit words x_i (a tail of 1-3 bytes counts as
one more word). Every weight is odd, so any change to a single word changes h; the weights are affine
in i, so h = 2A·S1 + (2A·start + 2B + 1)·S0 per piece (S0 = Σ x, S1 = Σ j·x) and a piece needs only a
cached arange, not per-offset weights. It is a fast integrity screen on the device, not CRC32C: the
move's manifest and `verify` still bind to CRC32C.
"""

from __future__ import annotations

import functools

import torch

A, B = 0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F
MASK = (1 << 64) - 1
PIECE_WORDS = 16 << 20  # 64 MiB of words per reduction, so temporaries stay bounded


@functools.cache
def _arange(n: int, device: torch.device) -> torch.Tensor:
    return torch.arange(n, dtype=torch.int64, device=device)


def _index(n: int, device: torch.device) -> torch.Tensor:
    """0..n-1, sliced from a cached arange of the next power of two: a few cached tensors per device
    whatever the piece sizes, not one (up to 128 MiB of device memory) per distinct size."""
    return _arange(1 << max(n - 1, 0).bit_length(), device)[:n]


def _words(flat: torch.Tensor) -> torch.Tensor:
    """The bytes as int64 words of 32 bits (zero-padded at the end)."""
    n = flat.numel()
    if n % 4:
        flat = torch.cat([flat, flat.new_zeros(4 - n % 4)])
    elif flat.storage_offset() % 4:
        flat = flat.clone()  # viewing bytes as int32 needs a 4-byte aligned start
    return flat.view(torch.int32).to(torch.int64) & 0xFFFFFFFF


def fingerprint(flat: torch.Tensor) -> int:
    """The fingerprint of a flat uint8 tensor; on CUDA the reduction runs on the device."""
    total = 0
    words = flat.numel() // 4 + (1 if flat.numel() % 4 else 0)
    for start in range(0, words, PIECE_WORDS):
        x = _words(flat[start * 4:(start + PIECE_WORDS) * 4])
        j = _index(x.numel(), flat.device)
        s0, s1 = x.sum(), (x * j).sum()  # int64 arithmetic wraps: exactly mod 2^64
        s0, s1 = int(s0) & MASK, int(s1) & MASK
        total += 2 * A * s1 + (2 * A * start + 2 * B + 1) * s0
    return total & MASK
