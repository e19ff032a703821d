"""The parts of the `cuda` paths that run without a GPU: `bench.gpu`'s section runner, the CUDA IPC
description of empty leaves, and a receiver whose slot cannot be allocated (as a device slot that does
not fit in device memory). The device fingerprint has its own tests (`test_devhash.py`)."""

from __future__ import annotations

import asyncio
import json
import secrets

import msgspec
import pytest
import torch

from bench import gpu
from libs.errors import IntegrityError, StatefleetError, Unauthorized
from libs.motion import manifest, shm
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


async def test_the_ipc_move_section_runs_its_moves_on_host_memory():
    """`bench.gpu`'s cross-process section, its receiver child and its statistics, with host leaves: the
    same flow as on a GPU (there the slots are on cuda:0 and the move goes by CUDA IPC)."""
    leaves = [torch.randint(0, 256, (n,), dtype=torch.uint8) for n in (3 << 20, 1 << 20, 5)]
    out = await gpu.ipc_move(leaves, d2d_gbps=100.0)
    assert out["digests_agree"] is True
    assert out["mode"] == ["memfd"] and out["checksum"] == ["crc32c"]
    assert len(out["runs_ms"]) == gpu.IPC_MOVES and out["cold_move_ms"] == out["runs_ms"][0]
    assert out["ipc_over_d2d"] == pytest.approx(out["verified_gbps"] / 100.0)
    json.dumps(out)
