"""A fingerprint of device memory computed on the device: 8 bytes come back, never the bytes.

The bytes are read as 32-bit words (a tail of 1-3 bytes zero-padded) in rows of ROW_WORDS, and the rows
in blocks of BLOCK_ROWS, both numbered from the start of the leaf. With R_g the word sum of row g and
K_bc the sum of column c within block b, each taken mod 2^32 as an unsigned number,

    h = Σ_g u(g)·R_g + Σ_b,c v(b, c)·K_bc   (mod 2^64)

where u and v are 64-bit hashes of the index, u odd and v even. A change to one word changes its R and
K by d - e·2^32 (0 < d < 2^32, e in {0, 1}) each, so h by d·(u + v) minus a multiple of 2^32: u + v is
odd, so the change has fewer than 32 factors of two and is never 0: every single-word change is seen.
The sums are mod 2^32 but the weights are not, so changes of a high bit in several words cancel only
if the weights happen to (about 2^-32; a hash mod 2^32 would see two flips of bit 31 only as a parity).
A change that leaves every row sum and every column sum of its block as it was is not seen: it is a
fast integrity screen, not CRC32C. The sums are two int32 reductions of the memory with no temporary of
its size, so on a GPU the fingerprint reads the bytes twice at memory speed, where a CRC32C would first
copy them to the host. h is a sum over blocks, so a leaf's fingerprint is the sum of its chunks'
(`combine`) when every chunk starts on a block (chunk offsets are multiples of BLOCK_BYTES). Zero
padding changes no sum, so a leaf's last, partial row and block count as if they were whole.

int64 products of the weights wrap: that is the mod 2^64 (torch's integer arithmetic wraps on CPU and
CUDA; the tests check the result against the definition).
"""

from __future__ import annotations

import torch

ROW_WORDS = 1024
ROW_BYTES = 4 * ROW_WORDS
BLOCK_ROWS = 256
BLOCK_BYTES = ROW_BYTES * BLOCK_ROWS  # 1 MiB: a chunk of a device-fingerprinted move is whole blocks
MASK32 = 0xFFFFFFFF
MASK64 = (1 << 64) - 1
UNALIGNED_PIECE_BYTES = 16 << 20  # an unaligned range is copied to an aligned buffer this much at a time
_U, _V = 0x9E3779B97F4A7C15, 0xD6E8FEB86659FD93  # odd 64-bit multipliers
_MIX1, _MIX2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


def _signed(k: int) -> int:
    return k - (1 << 64) if k >= 1 << 63 else k


def _weights(first: int, n: int, k: int, device: torch.device) -> torch.Tensor:
    """A 64-bit hash (splitmix64's finaliser, as int64 bit patterns) of each index first..first+n-1."""
    h = torch.arange(first, first + n, dtype=torch.int64, device=device) * _signed(k)
    h = (h ^ _shr(h, 30)) * _signed(_MIX1)
    h = (h ^ _shr(h, 27)) * _signed(_MIX2)
    return h ^ _shr(h, 31)


def _shr(h: torch.Tensor, n: int) -> torch.Tensor:
    """A logical right shift of int64 bit patterns (torch's >> is arithmetic)."""
    return (h >> n) & ((1 << (64 - n)) - 1)


def _weigh(m: torch.Tensor, first_block: int) -> torch.Tensor:
    """Σ u·R + Σ v·K of the [blocks, rows, ROW_WORDS] int32 words `m`: an int64 scalar on its device."""
    blocks, rows_per_block = m.shape[0], m.shape[1]
    rows = m.sum(2, dtype=torch.int32).to(torch.int64) & MASK32  # int32 sums wrap: exactly mod 2^32
    cols = m.sum(1, dtype=torch.int32).to(torch.int64) & MASK32
    first_row = first_block * BLOCK_ROWS
    u = _weights(first_row, blocks * rows_per_block, _U, m.device) | 1
    v = _weights(first_block * ROW_WORDS, blocks * ROW_WORDS, _V, m.device) & -2
    return (rows.reshape(-1) * u).sum() + (cols.reshape(-1) * v).sum()


def fingerprint(flat: torch.Tensor, start_byte: int = 0) -> int:
    """The fingerprint of the flat uint8 bytes `flat`, which begin `start_byte` bytes into their leaf
    (a multiple of BLOCK_BYTES). On CUDA the reductions run on the device and one sync brings 8 bytes back."""
    block = ROW_BYTES * BLOCK_ROWS
    if start_byte % block:
        raise ValueError(f"a fingerprinted range starts on a {block}-byte block, not at byte {start_byte}")
    n = flat.numel()
    if n == 0:
        return 0
    first_block, whole = start_byte // block, n - n % block
    total = torch.zeros((), dtype=torch.int64, device=flat.device)
    step = max(UNALIGNED_PIECE_BYTES // block, 1) * block if flat.storage_offset() % 4 else whole
    for at in range(0, whole, max(step, 1)):
        piece = flat[at:min(at + step, whole)]
        if piece.storage_offset() % 4:
            piece = piece.clone()  # viewing bytes as int32 needs a 4-byte aligned start
        total += _weigh(piece.view(torch.int32).view(-1, BLOCK_ROWS, ROW_WORDS), first_block + at // block)
    if whole < n:  # the last, partial block: its rows zero-padded to whole rows
        rest = flat.new_zeros(-(-(n - whole) // ROW_BYTES) * ROW_BYTES)
        rest[:n - whole] = flat[whole:]
        total += _weigh(rest.view(torch.int32).view(1, -1, ROW_WORDS), first_block + whole // block)
    return int(total) & MASK64


def combine(values: list[int]) -> int:
    """A leaf's fingerprint from its chunks' (each taken with its own `start_byte`)."""
    return sum(values) & MASK64


def fold(value: int) -> int:
    """32 bits of a fingerprint, for a field of 32 bits (a chunk frame's CRC); every bit of it counts."""
    return (value ^ (value >> 32)) & MASK32
