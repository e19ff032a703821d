"""The parts of the `cuda` paths that run without a GPU: `bench.gpu`'s section runner and the CUDA IPC
description of empty leaves."""

from __future__ import annotations

import asyncio
import json

import msgspec
import pytest
import torch

from bench import gpu
from libs.errors import IntegrityError
from libs.motion import manifest, shm


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
