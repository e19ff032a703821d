"""Reference backends: bit-exact for the same seed and inputs, window rewrite, typed input errors."""

from __future__ import annotations

import pytest
import torch

from libs.checkpoint import clone_tree, trees_equal
from libs.errors import BadRequest, TooLarge
from libs.schemas.common import InputItem
from libs.schemas.engine import SessionInit
from services.engine_host.backends import AvatarBackend, WorldBackend, WorldConfig, advance
from tests.support.items import item


def run(backend, seed: int, inputs_per_block: list[list], tier: int):
    state = backend.init_state(seed, SessionInit(prompt="a prompt"))
    outs = [advance(backend, state, inputs, tier) for inputs in inputs_per_block]
    return state, outs


@pytest.mark.parametrize("make,inputs", [
    (WorldBackend, [[item("action", {"keys": ["w", "shift"], "mouse": [5, -3]})], [], [item("action", {"keys": []})]]),
    (AvatarBackend, [[item("text", "hello there")], [], [item("text", "and again"), item("text", "more")]]),
])
def test_same_seed_and_inputs_are_bit_exact(make, inputs):
    a, b = make(), make()  # two instances: weights come from the fixed seed, not from shared memory
    parsed = [[a.parse_input(i) for i in block] for block in inputs]
    s1, o1 = run(a, 11, parsed, a.tiers[-1])
    s2, o2 = run(b, 11, parsed, b.tiers[-1])
    assert trees_equal(s1, s2)
    for x, y in zip(o1, o2, strict=True):
        assert torch.equal(x.frames, y.frames)
        assert (x.audio is None and y.audio is None) or torch.equal(x.audio, y.audio)
    s3, o3 = run(a, 12, parsed, a.tiers[-1])
    assert not torch.equal(o1[-1].frames, o3[-1].frames)
    if make is AvatarBackend:
        assert o1[0].audio.dtype == torch.int16 and o1[0].frames.shape == (10, 3, 256, 256)
        assert s1["phase"] != 0.0  # the oscillator phase carries across chunks


def test_inputs_change_the_world():
    w = WorldBackend()
    go = [[w.parse_input(item("action", {"keys": ["w"]}))]] * 3
    stay = [[]] * 3
    _, a = run(w, 1, go, 2)
    _, b = run(w, 1, stay, 2)
    assert not torch.equal(a[-1].frames, b[-1].frames)


def test_world_rewrites_three_quarters_of_its_window_in_place():
    w = WorldBackend()
    state = w.init_state(5, SessionInit())
    kv = state["kv"]
    for _ in range(3):
        before = kv.clone()
        advance(w, state, [], 1)
        assert state["kv"] is kv  # in place
        changed = (before != kv).any(dim=-1).float().mean().item()
        assert changed == pytest.approx(0.75)


def test_world_cache_size_is_configurable():
    cfg = WorldConfig.for_state_bytes(256 << 20)
    assert abs(cfg.state_bytes - (256 << 20)) / (256 << 20) < 0.01
    assert WorldConfig.for_state_bytes(4 << 30).state_bytes > 4e9
    small = WorldConfig()
    assert small.cache_bytes < 1 << 20
    assert small.state_bytes == sum(t.numel() * t.element_size() for k, t in WorldBackend(small).init_state(1, SessionInit()).items()
                                    if k in ("kv", "pos", "latent", "action"))


def test_fewer_denoise_steps_differ_and_state_depends_on_tier():
    w = WorldBackend()
    s1, s2 = w.init_state(1, SessionInit()), w.init_state(1, SessionInit())
    o1 = advance(w, s1, [], 1)
    o2 = advance(w, s2, [], 4)
    assert not torch.equal(o1.frames, o2.frames)


@pytest.mark.parametrize("bad", [
    item("text", "hi"), item("action", ["w"]), item("action", {"keys": ["q"]}), item("action", {"keys": "w"}),
    item("action", {"mouse": [1]}), item("action", {"mouse": [1e9, 0]}), item("action", {"mouse": [True, 0]}),
    item("action", {"jump": 1}), InputItem(session_id="s", seq=1, kind="action", data=b"{not json"),
])
def test_world_rejects_bad_inputs(bad):
    with pytest.raises(BadRequest):
        WorldBackend().parse_input(bad)


def test_avatar_rejects_bad_inputs():
    a = AvatarBackend()
    for bad in (item("action", {"keys": []}), item("text", {"t": 1}), item("json", {}),
                InputItem(session_id="s", seq=1, kind="text", data=b"\xff")):
        with pytest.raises(BadRequest):
            a.parse_input(bad)
    with pytest.raises(TooLarge):
        a.parse_input(item("text", "x" * 257))


@pytest.mark.parametrize("make", [WorldBackend, AvatarBackend])
def test_batched_denoise_matches_single_blocks(make):
    b = make()
    states = [b.init_state(s, SessionInit(prompt="p")) for s in (1, 2, 3)]
    twins = clone_tree(states)
    carries = [b.encode(s, []) for s in states]
    batched = b.denoise_batch(states, carries, b.tiers[0])
    singles = [b.denoise(s, b.encode(s, []), b.tiers[0]) for s in twins]
    for x, y in zip(batched, singles, strict=True):
        torch.testing.assert_close(x, y)
    assert [s["block"] for s in states] == [t["block"] for t in twins] == [1, 1, 1]
