"""wan_causal: diffusers' Wan modules driven block-causally. Streamed blocks equal a full masked
pass (after the ring wraps too), ring storage stays put, sessions are bit-exact and continue
bit-identically after a restore, the published sizes come from the spec alone."""

from __future__ import annotations

import pytest
import torch

from libs.checkpoint import clone_tree, trees_equal
from libs.errors import BadRequest, ConfigError
from services.engine_host.backends import spec as specs
from services.engine_host.backends.base import advance, forward_passes
from services.engine_host.backends.wan_causal import WanCausalBackend, WanCausalConfig, layout
from services.engine_host.backends.wan_causal.attention import Ring, ring_slots
from services.engine_host.backends.wan_causal.config import schedule
from services.engine_host.backends.wan_causal.forward import forward
from services.engine_host.host_endpoint import complete
from tests.backends.wan_helpers import I2V, IMAGE, ROAD, T2V, FullMask, act

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning")


@pytest.fixture(scope="module")
def t2v() -> WanCausalBackend:
    return WanCausalBackend(T2V)


@pytest.fixture(scope="module")
def i2v() -> WanCausalBackend:
    return WanCausalBackend(I2V)


def _actions(b: WanCausalBackend, state: dict, blocks: int):
    """Each block's action windows, as encode cuts them from a changing stream of actions."""
    inputs = [[b.parse_input(act(["w"], (30, -4)))], [], [b.parse_input(act(["a"], (-50, 7))),
                                                          b.parse_input(act(["d", "s"]))]]
    return [b.encode(state, inputs[i % 3]) for i in range(blocks)]


@pytest.mark.parametrize("which", ["t2v", "i2v"])
@torch.no_grad()
def test_streamed_blocks_equal_a_full_block_causal_sliding_window_pass_after_the_ring_wraps(which, request):
    b: WanCausalBackend = request.getfixturevalue(which)
    a, blocks = b.arch, 5  # 10 frames through a 1 + 4 ring (i2v: a 4-frame window)
    init = IMAGE if a.image_dim else ROAD
    state = b.init_state(3, init)
    acts = _actions(b, state, blocks) if a.action_blocks else [None] * blocks
    g = torch.Generator().manual_seed(0)
    lat = torch.randn(blocks * a.frames_per_block, a.in_channels, a.latent_h, a.latent_w, generator=g)
    t = torch.full((a.frames_per_block,), 0.0)
    streamed = []
    for blk in range(blocks):
        f0 = blk * a.frames_per_block
        slots = torch.tensor(ring_slots(a, f0, a.frames_per_block))
        rings = [Ring(layer, slots, min(f0 + a.frames_per_block, a.slots)) for layer in state["layers"]]
        streamed.append(forward(a, b.m, lat[f0:f0 + a.frames_per_block], t, f0, rings.__getitem__, state["layers"],
                                acts[blk]))
    n = blocks * a.frames_per_block
    full_acts = None if acts[0] is None else tuple(torch.cat([x[i] for x in acts]) for i in range(2))
    full = forward(a, b.m, lat, torch.zeros(n), 0, lambda i: FullMask(a, n), state["layers"], full_acts)
    torch.testing.assert_close(torch.cat(streamed), full, rtol=1e-4, atol=1e-5)
    # the window matters: without the mask's window the last block differs
    unwindowed = forward(a, b.m, lat, torch.zeros(n), 0, lambda i: lambda name, k, v: (k, v, FullMask(
        a.__class__(**{**{f: getattr(a, f) for f in a.__struct_fields__}, "window_frames": n}), n).mask),
        state["layers"], full_acts)
    assert not torch.allclose(unwindowed[-a.frames_per_block:], full[-a.frames_per_block:], atol=1e-4)


def test_ring_storage_never_reallocates_and_sessions_are_bit_exact(t2v):
    state = t2v.init_state(5, ROAD)
    snap = specs.LeafSnapshot.take(state, t2v.state_spec())
    ptrs = [layer["k"].data_ptr() for layer in state["layers"]]
    outs = [advance(t2v, state, [], 2) for _ in range(4)]  # the ring wraps at the third block
    snap.verify(state)
    assert ptrs == [layer["k"].data_ptr() for layer in state["layers"]]
    assert outs[0].frames.shape[0] == 4 * 2 - 3 and outs[1].frames.shape[0] == 8  # 1 + 4, then 2 × 4
    again = t2v.init_state(5, ROAD)
    assert all(torch.equal(x.frames, advance(t2v, again, [], 2).frames) for x in outs)
    other = t2v.init_state(5, ROAD.__class__(prompt="a harbour"))
    assert not torch.equal(outs[0].frames, advance(t2v, other, [], 2).frames)


def test_schedule_is_the_shifted_step_list_and_a_block_takes_a_clean_pass(t2v):
    assert [round(s, 4) for s in schedule((1000, 750, 500, 250), 4, 5.0)] == [1.0, 0.9375, 0.8333, 0.625]
    assert schedule((1000, 666, 333), 1, 5.0) == [1.0]
    assert t2v.tiers == (1, 2, 3, 4) and forward_passes(t2v, 4) == 5


@pytest.mark.parametrize("blocks", [2])
def test_a_restored_session_continues_bit_identically(i2v, blocks):
    """A move's destination (or a failover from a checkpoint) gets the moved leaves only: it
    regenerates the static ones from the init image and rebuilds the decoder cache from the
    latent history; the next blocks must equal the source's."""
    state = i2v.init_state(7, IMAGE)
    a1 = i2v.parse_input(act(["w"], (30, -4)))
    for _ in range(blocks):
        advance(i2v, state, [a1], 1)
    moved = clone_tree(specs.select(state, i2v.state_spec()))
    restored, _ = complete(i2v, moved, 7, IMAGE)
    assert trees_equal(restored, state)
    a2 = i2v.parse_input(act(["a", "s"], (-20, 9)))
    for inputs in ([a2], []):
        assert torch.equal(advance(i2v, state, inputs, 2).frames, advance(i2v, restored, inputs, 2).frames)


def test_inputs_and_configs_are_refused_with_typed_errors(t2v, i2v):
    with pytest.raises(BadRequest):
        t2v.parse_input(act(["w"]))
    with pytest.raises(BadRequest):
        i2v.parse_input(act(["jump"]))
    with pytest.raises(BadRequest, match="image"):
        i2v.init_state(1, ROAD)
    with pytest.raises(ConfigError, match="needs its weights"):
        WanCausalBackend(WanCausalConfig())
    with pytest.raises(ConfigError, match="not both"):
        WanCausalBackend(WanCausalConfig(random_weights=True, weights_dir="/nowhere"))


GB = 1e9


def test_the_published_real_scale_state_comes_from_the_spec_without_allocating():
    """Matrix-Game-2 at 352×640 in bf16: self-attention KV over 6 frames × 880 tokens in 30 blocks,
    the mouse KV in the 15 action blocks only, the CLIP cross-attention cache, the decoder cache."""
    spec = layout.state_spec(WanCausalConfig(preset="matrix_game_2", dtype="bfloat16", random_weights=True))
    leaves = dict(specs.leaves(spec))

    def total(suffix: str) -> int:
        return sum(t.nbytes for p, t in leaves.items() if isinstance(t, specs.TensorSpec) and p.endswith(suffix))

    assert total("/k") + total("/v") == 30 * 2 * 6 * 880 * 1536 * 2  # 0.97 GB
    assert total("mouse_k") + total("mouse_v") == 15 * 2 * 6 * 880 * 1024 * 2  # 0.32 GB, not dit's 0.65
    assert sum(1 for p in leaves if p.endswith("mouse_k")) == 15
    assert total("cross_k") + total("cross_v") == 30 * 2 * 257 * 1536 * 2 == specs.tensor_bytes(spec, "static") - 20 * 44 * 80 * 4
    assert specs.tensor_bytes(spec, "rebuildable") == pytest.approx(1.07 * GB, rel=0.01)  # the Wan decoder's cache
    assert leaves["actions"].shape == (12, 6) and leaves["image_cond"].shape == (20, 44, 80)
    sf = layout.state_spec(WanCausalConfig(preset="self_forcing", dtype="bfloat16", random_weights=True))
    assert specs.tensor_bytes(sf["layers"], "moved") == 30 * 2 * 21 * 1560 * 1536 * 2  # 6.04 GB over 21 frames
    ll = layout.state_spec(WanCausalConfig(preset="longlive", dtype="bfloat16", random_weights=True))
    assert specs.tensor_bytes(ll["layers"], "moved") == 30 * 2 * 12 * 1560 * 1536 * 2  # 3 sink + 9 rolling
