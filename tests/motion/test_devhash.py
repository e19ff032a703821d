"""The device fingerprint and the moves that carry it (`libs.motion.devhash`, `libs.motion.checksum`).

Invariants: the fingerprint is what its docstring defines (checked against a pure-Python reading of the
definition); a leaf's fingerprint is the sum of its chunks' wherever the chunks start on a row, so the
manifest the sender builds from chunk values equals what `commit`'s full pass recomputes; every change
of a single word changes it; and a slot binds only a manifest whose values are of the kind it staged."""

from __future__ import annotations

import contextlib

import msgspec
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from libs.errors import BadRequest, IntegrityError, SchemaError
from libs.motion import checksum, devhash, manifest, shm
from libs.motion.checked_copy import check_staged
from libs.motion.sender import chunk_grid, leaf_crcs_from_chunks
from libs.motion.slot import ShadowSlot, SlotState, staged_digest
from libs.schemas.base import decode, encode
from libs.schemas.motion import Manifest

ROW, BLOCK = devhash.ROW_BYTES, devhash.BLOCK_BYTES


def _weight(i: int, k: int) -> int:
    """splitmix64's finaliser of i·k, in Python integers."""
    m = (1 << 64) - 1
    h = (i * k) & m
    h = ((h ^ (h >> 30)) * devhash._MIX1) & m
    h = ((h ^ (h >> 27)) * devhash._MIX2) & m
    return h ^ (h >> 31)


def _reference(data: bytes, first_block: int = 0) -> int:
    """The definition, word by word: Σ u(g)·(row sum mod 2^32) + Σ v(b, c)·(column sum in block b mod 2^32)."""
    data += bytes(-len(data) % ROW)
    words = [int.from_bytes(data[i:i + 4], "little") for i in range(0, len(data), 4)]
    n, per = devhash.ROW_WORDS, devhash.BLOCK_ROWS
    rows = [words[i:i + n] for i in range(0, len(words), n)]
    h = sum((_weight(first_block * per + g, devhash._U) | 1) * (sum(r) & 0xFFFFFFFF) for g, r in enumerate(rows))
    for b in range(0, len(rows), per):
        block = rows[b:b + per]
        h += sum((_weight((first_block + b // per) * n + c, devhash._V) & ~1) * (sum(r[c] for r in block) & 0xFFFFFFFF)
                 for c in range(n))
    return h & ((1 << 64) - 1)


@contextlib.contextmanager
def _small_blocks():
    """Blocks of 2 rows (8 KiB): ranges of a few blocks stay small enough for the word-by-word reference."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(devhash, "BLOCK_ROWS", 2)
        yield 2 * ROW


def _bytes(n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 256, (n,), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


@settings(max_examples=30, deadline=None)
@given(n=st.integers(0, 7 * ROW + 9), first_block=st.integers(0, 1 << 20), seed=st.integers(0, 99))
def test_fingerprint_matches_its_definition(n, first_block, seed):
    data = _bytes(n, seed)
    with _small_blocks() as block:
        assert devhash.fingerprint(data, first_block * block) == _reference(data.numpy().tobytes(), first_block)


def test_fingerprint_matches_its_definition_at_full_size():
    data = _bytes(devhash.BLOCK_BYTES + 3 * ROW + 5, 7)
    assert devhash.fingerprint(data, devhash.BLOCK_BYTES) == _reference(data.numpy().tobytes(), 1)


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 17 * ROW), blocks_per_chunk=st.integers(1, 3), seed=st.integers(0, 99))
def test_a_leaf_is_the_sum_of_its_chunks(n, blocks_per_chunk, seed):
    data = _bytes(n, seed)
    with _small_blocks() as block:
        chunk = blocks_per_chunk * block
        parts = [devhash.fingerprint(data[off:off + chunk], off) for off in range(0, n, chunk)]
        assert devhash.combine(parts) == devhash.fingerprint(data)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(4, 5 * ROW), where=st.floats(0, 1, exclude_max=True),
       delta=st.integers(1, (1 << 32) - 1), seed=st.integers(0, 99))
def test_every_change_of_one_word_is_seen(n, where, delta, seed):
    data = _bytes(n, seed)
    word = int(where * (n // 4))
    changed = data.clone()
    old = int.from_bytes(changed[4 * word:4 * word + 4].numpy().tobytes(), "little")
    new = (old + delta) & 0xFFFFFFFF
    changed[4 * word:4 * word + 4] = torch.frombuffer(bytearray(new.to_bytes(4, "little")), dtype=torch.uint8)
    assert devhash.fingerprint(changed) != devhash.fingerprint(data)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(8, 6 * ROW), a=st.floats(0, 1, exclude_max=True), b=st.floats(0, 1, exclude_max=True),
       bit=st.integers(0, 31), seed=st.integers(0, 99))
def test_the_same_bit_flipped_in_two_words_is_seen(n, a, b, bit, seed):
    """Two sign flips (bit 31 of two fp32 words) anywhere: a hash mod 2^32 sees only their parity."""
    data = _bytes(n, seed)
    i, j = int(a * (n // 4)), int(b * (n // 4))
    if i == j:
        j = (i + 1) % (n // 4)
    changed = data.clone()
    words = changed[:n // 4 * 4].view(torch.int32)
    words[i] ^= _signed_bit(bit)
    words[j] ^= _signed_bit(bit)
    assert devhash.fingerprint(changed) != devhash.fingerprint(data)


def _signed_bit(bit: int) -> int:
    return -(1 << 31) if bit == 31 else 1 << bit


def test_negating_floats_is_seen():
    x = torch.randn(1 << 20, generator=torch.Generator().manual_seed(5))
    before = devhash.fingerprint(x.view(torch.uint8))
    for i, j in ((3, 7), (10, 500_000), (0, 1 << 19)):
        y = x.clone()
        y[i], y[j] = -y[i], -y[j]
        assert devhash.fingerprint(y.view(torch.uint8)) != before


def test_an_unaligned_view_and_an_off_grid_range():
    buf = _bytes(7 * ROW + 1001, 1)
    view = buf[1:]  # starts one byte into the storage
    with _small_blocks(), pytest.MonkeyPatch.context() as mp:
        mp.setattr(devhash, "UNALIGNED_PIECE_BYTES", 2 * ROW)  # several aligned copies, one block each
        assert devhash.fingerprint(view) == _reference(view.numpy().tobytes())
        with pytest.raises(ValueError):
            devhash.fingerprint(buf[:8], ROW)


def test_a_manifests_values_are_bound_to_their_kind():
    flat = manifest.flatten({"kv": torch.arange(4096, dtype=torch.float32)})
    crc_m = manifest.build("s", flat, [7])
    dev_m = manifest.build("s", flat, [7], kind=checksum.DEVHASH)
    assert crc_m.checksum == checksum.CRC32C and dev_m.checksum == checksum.DEVHASH
    assert crc_m.fingerprint != dev_m.fingerprint  # the same numbers of another kind are another manifest
    manifest.check_consistent(dev_m)
    with pytest.raises(BadRequest):  # relabelled: its fingerprint no longer matches
        manifest.check_consistent(msgspec.structs.replace(dev_m, checksum=checksum.CRC32C))
    with pytest.raises(BadRequest):
        manifest.check_consistent(msgspec.structs.replace(dev_m, checksum="md5"))
    with pytest.raises(SchemaError):  # nor does one arrive over the bus
        decode(encode(msgspec.structs.replace(dev_m, checksum="md5")), Manifest)


def _staged_devhash_slot(state: dict, chunk: int) -> tuple[ShadowSlot, manifest.Flat, list[int]]:
    """A slot that staged `state` chunk by chunk the way a CUDA IPC receiver does (copy, then check the
    chunk's device fingerprint against the sender's), on host memory here; returns the sender's values."""
    flat = manifest.flatten(state)
    layout = manifest.build("s", flat, [0] * len(flat.tensors))
    slot = ShadowSlot("s", "m", "t", layout.total_bytes, torch.device("cpu"), lease_s=30)
    slot.open(layout, chunk)
    slot.checksum = checksum.DEVHASH
    views = [t.reshape(-1).view(torch.uint8) for t in flat.tensors]
    values = []
    for leaf, off, n in chunk_grid(flat, chunk):
        values.append(devhash.fingerprint(views[leaf][off:off + n], off))
        region = slot.region(leaf, off, n)
        region.copy_(views[leaf][off:off + n])
        check_staged(slot, leaf, off, region, checksum.on_wire(checksum.DEVHASH, values[-1]))
    return slot, flat, values


async def test_a_device_fingerprinted_move_verifies_and_commit_sees_a_flipped_byte():
    state = {"kv": [_bytes(2 * BLOCK + 5 * ROW + 123, 2), torch.randn(3000)], "ctl": 3}
    slot, flat, values = _staged_devhash_slot(state, BLOCK)
    leaves = leaf_crcs_from_chunks(flat, chunk_grid(flat, BLOCK), values, checksum.DEVHASH)
    assert slot.finish() == staged_digest(leaves, checksum.DEVHASH)
    m = manifest.build("s", flat, leaves, kind=checksum.DEVHASH)
    assert await manifest.leaf_crcs(flat.tensors, checksum.DEVHASH) == leaves  # what commit recomputes
    await slot.verify(m, full=False)
    await slot.verify(m, full=True)
    slot.tensors[1].view(torch.uint8)[77] ^= 1
    with pytest.raises(IntegrityError):
        await slot.verify(m, full=True)


async def test_a_slot_refuses_a_manifest_of_the_other_kind():
    state = {"kv": _bytes(3 * ROW, 3)}
    slot, flat, values = _staged_devhash_slot(state, BLOCK)
    slot.finish()
    leaves = leaf_crcs_from_chunks(flat, chunk_grid(flat, BLOCK), values, checksum.DEVHASH)
    with pytest.raises(IntegrityError, match="devhash64"):
        await slot.verify(manifest.build("s", flat, leaves), full=False)  # the same values, called CRC32C
    assert slot.state is SlotState.FAILED


def test_a_device_slot_fingerprints_on_the_device_only_chunks_of_whole_rows():
    slot = ShadowSlot("s", "m", "t", 1 << 20, torch.device("cuda", 0), lease_s=30)  # never allocated here
    slot.chunk_bytes = BLOCK + ROW
    assert shm.ready_for(slot).mode == "cuda_ipc"
    assert slot.checksum == checksum.CRC32C  # the sender decides alike: CRC32C through host
    slot.chunk_bytes = shm.DEVICE_CHUNK_BYTES
    assert shm.ready_for(slot).mode == "cuda_ipc"
    assert slot.checksum == checksum.DEVHASH == checksum.for_device_move(shm.DEVICE_CHUNK_BYTES)


def test_an_in_process_device_copy_checks_each_chunk_by_its_fingerprint():
    """`copy_and_check` on a device-fingerprinted slot (the in-process path between two GPUs), on host here:
    the staged chunk's fingerprint must equal the one the source gave, or it is refused unrecorded."""
    from libs.motion.checked_copy import copy_and_check

    data = _bytes(2 * BLOCK, 4)
    flat = manifest.flatten({"kv": data})
    slot = ShadowSlot("s", "m", "t", data.numel(), torch.device("cpu"), lease_s=30)
    slot.open(manifest.build("s", flat, [0]), BLOCK)
    slot.checksum = checksum.DEVHASH
    assert copy_and_check(slot, 0, 0, data[:BLOCK]) == devhash.fingerprint(data[:BLOCK])
    with pytest.raises(IntegrityError):
        copy_and_check(slot, 0, BLOCK, data[BLOCK:], devhash.fingerprint(data[BLOCK:], BLOCK) ^ 1)
    assert slot.chunk_crcs == [[devhash.fingerprint(data[:BLOCK]), None]]
