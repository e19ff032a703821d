"""The parts of the `cuda` paths that run without a GPU: `bench.gpu`'s section runner, the CUDA IPC
description of empty leaves, the device fingerprint's arithmetic and alignment, and a receiver whose
slot cannot be allocated (as a device slot that does not fit in device memory)."""

from __future__ import annotations

import asyncio
import json
import secrets

import msgspec
import pytest
import torch

from bench import gpu
from libs.errors import IntegrityError, StatefleetError, Unauthorized
from libs.motion import devhash, manifest, shm
from libs.motion.receiver import DataPlane
from libs.motion.sender import chunk_grid, send_chunks
from libs.motion.slot import ShadowSlot, SlotState
from libs.motion.tcp import TcpChannel


async def test_a_section_given_as_a_lambda_around_a_coroutine_is_awaited():
    async def move() -> dict:
        await asyncio.sleep(0)
        return {"verified_gbps": 1.5}

    out: dict = {"sections_s": {}}
    await gpu.run_section(out, "move", lambda: move(), 10)
    await gpu.run_section(out, "plain", lambda: {"gbps": 2.0}, 10)
    await gpu.run_section(out, "hangs", lambda: asyncio.sleep(30), 0.05)
    await gpu.run_section(out, "late", lambda: move(), 0)
    assert out["move"] == {"verified_gbps": 1.5}
    assert out["plain"] == {"gbps": 2.0}
    assert out["hangs"]["error"].startswith("TimeoutError")
    assert "skipped" in out["late"]
    json.dumps(out)  # what bench.gpu writes


def test_an_empty_leaf_travels_without_an_ipc_handle():
    leaves = [shm.cuda_leaf(torch.empty(0, dtype=torch.uint8))]
    wire = shm.message(shm._Handles(leaves))
    got = msgspec.msgpack.decode(wire[4:], type=shm._Handles).leaves
    layout = manifest.build("s", manifest.flatten({"empty": torch.empty(0, 4)}), [0])
    sources = shm.open_sources(got, layout)
    assert [s.numel() for s in sources] == [0]


def test_a_non_empty_leaf_without_a_handle_is_refused():
    layout = manifest.build("s", manifest.flatten({"kv": torch.zeros(8)}), [0])
    with pytest.raises(IntegrityError):
        shm.open_sources([shm.CudaLeaf(0, b"", 32, 0, b"", 0, b"", False, 0)], layout)


def _reference(data: bytes) -> int:
    data += bytes(-len(data) % 4)
    words = [int.from_bytes(data[i:i + 4], "little") for i in range(0, len(data), 4)]
    return sum(x * (2 * devhash.A * i + 2 * devhash.B + 1) for i, x in enumerate(words)) & devhash.MASK


@pytest.mark.parametrize("nbytes", [0, 1, 3, 4, 37, 64])
def test_fingerprint_matches_its_definition_across_pieces(monkeypatch, nbytes):
    monkeypatch.setattr(devhash, "PIECE_WORDS", 4)  # several pieces: the per-piece weight offsets count
    data = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=torch.Generator().manual_seed(nbytes))
    assert devhash.fingerprint(data) == _reference(data.numpy().tobytes())


def test_fingerprint_of_an_unaligned_view():
    buf = torch.randint(0, 256, (1001,), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    view = buf[1:]  # 1000 bytes starting one byte into the storage
    assert devhash.fingerprint(view) == _reference(view.numpy().tobytes())


def test_fingerprint_caches_few_index_tensors():
    devhash._arange.cache_clear()
    for n in range(1, 400, 7):
        devhash.fingerprint(torch.zeros(n, dtype=torch.uint8))
    assert devhash._arange.cache_info().currsize <= 8  # powers of two up to 128 words, not one per size


async def test_a_slot_that_cannot_be_allocated_is_failed_and_the_sender_told(monkeypatch):
    """On a GPU an incoming device slot can exceed free device memory: torch raises OutOfMemoryError (a
    RuntimeError). The receiver fails the slot and acknowledges with the reason, as for any refusal."""
    token = secrets.token_hex(16)
    state = {"kv": torch.arange(4096, dtype=torch.float32)}
    flat = manifest.flatten(state)
    layout = manifest.build("s", flat, [0])
    slot = ShadowSlot("s", "m", token, layout.total_bytes, torch.device("cpu"), lease_s=30)

    def out_of_memory(_layout):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 16.00 KiB")

    monkeypatch.setattr(slot, "_allocate", out_of_memory)

    def claim(t: str) -> ShadowSlot:
        if t != token:
            raise Unauthorized("bad token")
        return slot

    plane = DataPlane(claim)
    await plane.start()
    try:
        ch = await TcpChannel.open(plane.addr, token, layout, 4096)
        try:
            with pytest.raises(StatefleetError):
                await send_chunks(ch, flat, chunk_grid(flat, 4096), bounce=False)
                await ch.finish()
        finally:
            await ch.close()
    finally:
        await plane.stop()
    assert slot.state is SlotState.FAILED
    assert "out of memory" in slot.reason
