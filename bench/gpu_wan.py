"""bench.gpu's `wan_causal` section: the block-causal Wan 2.1 backend served at real scale
(random weights named so in its config, bf16, on the device): per-block latency at each tier,
the session's state bytes by role, a verified CUDA IPC move of its moved leaves (`bench.gpu`'s
mover), and a bit-exact continuation after the move (the destination's rebuild and regenerated
static leaves included).

`serve(...)` runs on any device; `tests/backends/test_wan_causal_bench.py` runs its flow on CPU at a
tiny config, so the one device call finds it working.
"""

from __future__ import annotations

import json
import statistics
import time

import torch

from libs.checkpoint import clone_tree, trees_equal
from libs.schemas.engine import RawImage, SessionInit
from services.engine_host.backends import spec as specs
from services.engine_host.backends.base import advance
from services.engine_host.backends.wan_causal import WanCausalBackend, WanCausalConfig
from services.engine_host.host_endpoint import complete

PRESET = "matrix_game_2"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _init(b: WanCausalBackend) -> SessionInit:
    if b.arch.image_dim:
        w, h = 64, 36
        return SessionInit(image=RawImage(width=w, height=h, rgb=bytes((i * 7) % 256 for i in range(w * h * 3))))
    return SessionInit(prompt="a road through a forest")


def _inputs(b: WanCausalBackend, i: int) -> list:
    if not b.arch.action_blocks:
        return []
    from libs.schemas.common import InputItem

    keys = [["w"], ["a"], [], ["d", "s"]][i % 4]
    data = json.dumps({"keys": keys, "mouse": [i * 11 % 60 - 30, 3]}).encode()
    return [b.parse_input(InputItem(session_id="s", seq=i + 1, kind="action", data=data))]


def serve(config: WanCausalConfig, device: torch.device, blocks: int, tiers: tuple[int, ...] | None = None,
          move=None) -> dict:
    """Blocks of one session at each tier (medians after a warm-up block), then `move(leaves)` of its
    moved leaves when given, then the moved copy completed as a destination would and two more blocks
    of both, compared bit for bit."""
    b = WanCausalBackend(config, device)
    spec = b.state_spec()
    init = _init(b)
    state = b.init_state(1, init)
    advance(b, state, _inputs(b, 0), b.tiers[-1])
    block_ms, step = {}, 1
    for tier in tiers or b.tiers:
        times = []
        for _ in range(blocks):
            _sync(device)
            t0 = time.perf_counter()
            advance(b, state, _inputs(b, step), tier)
            _sync(device)
            times.append((time.perf_counter() - t0) * 1000)
            step += 1
        block_ms[str(tier)] = statistics.median(times)
    out = {"preset": config.preset if config.arch is None else "custom", "dtype": config.dtype,
           "block_ms_by_tier": block_ms, "media_ms_per_block": b.media_s_per_block * 1000,
           "leaves": sum(1 for _, t in specs.leaves(spec) if isinstance(t, specs.TensorSpec)),
           **{f"state_bytes_{r}": specs.tensor_bytes(spec, r) for r in specs.ROLES}}
    moved = specs.select(state, spec)
    if move is not None:
        out["ipc_move"] = move(_tensors(moved))
    copy = clone_tree(moved)
    t0 = time.perf_counter()
    dest, _ = complete(b, copy, 1, init)  # regenerate static leaves, rebuild the decoder cache
    _sync(device)
    out["complete_ms"] = (time.perf_counter() - t0) * 1000
    identical = trees_equal(dest, state)
    for i in range(2):
        inputs = _inputs(b, step + i)
        identical &= torch.equal(advance(b, state, inputs, 1).frames, advance(b, dest, inputs, 1).frames)
    out["continues_bit_identically"] = bool(identical)
    return out


def _tensors(tree) -> list[torch.Tensor]:
    if isinstance(tree, torch.Tensor):
        return [tree]
    if isinstance(tree, dict):
        return [t for v in tree.values() for t in _tensors(v)]
    if isinstance(tree, list):
        return [t for v in tree for t in _tensors(v)]
    return []


def real_scale_config() -> WanCausalConfig:
    return WanCausalConfig(preset=PRESET, random_weights=True, embedder="random", dtype="bfloat16")
