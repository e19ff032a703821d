"""bench.gpu's wan_causal section runs its whole flow on CPU at a tiny config: blocks per tier,
the moved leaves handed to the mover, the destination's completion and a bit-exact continuation."""

from __future__ import annotations

import pytest
import torch

from bench import gpu_wan
from services.engine_host.backends import spec as specs
from services.engine_host.backends.wan_causal import layout
from tests.backends.wan_helpers import I2V

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning")


def test_the_gpu_section_flow_serves_moves_and_continues_bit_identically_on_cpu():
    handed: list[torch.Tensor] = []

    def move(leaves: list[torch.Tensor]) -> dict:
        handed.extend(leaves)
        return {"bytes": sum(t.numel() * t.element_size() for t in leaves)}

    out = gpu_wan.serve(I2V, torch.device("cpu"), 1, (1,), move)
    spec = layout.state_spec(I2V)
    assert out["continues_bit_identically"] is True
    assert out["ipc_move"]["bytes"] == specs.tensor_bytes(spec, "moved") == out["state_bytes_moved"]
    assert len(handed) == sum(1 for _, t in specs.leaves(spec) if isinstance(t, specs.TensorSpec) and t.role == "moved")
    assert set(out["block_ms_by_tier"]) == {"1"} and out["block_ms_by_tier"]["1"] > 0
    assert gpu_wan.real_scale_config().dtype == "bfloat16" and gpu_wan.real_scale_config().random_weights
