"""The causal DiT world model: bit-exact, published size, safetensors weights, ring writes, rebuild."""

from __future__ import annotations

import json

import msgspec
import pytest
import torch

from libs.checkpoint import clone_tree, trees_equal
from libs.errors import BadRequest, ConfigError
from libs.motion import manifest
from libs.motion.sender import chunk_crcs, chunk_grid
from libs.schemas.common import InputItem
from libs.schemas.engine import RawImage, SessionInit
from services.engine_host.backends import spec as specs
from services.engine_host.backends import weights
from services.engine_host.backends.base import advance, forward_passes
from services.engine_host.backends.dit import DitConfig, DitWorldBackend, state_spec
from services.engine_host.host_endpoint import complete

# Matrix-Game-2 per session, as read from its inference code (`wan/modules/causal_model.py`,
# `action_module.py`, `configs/distilled_model/universal/config.json`; issues 15 and 25):
# self-attention KV over the 6-frame window in 30 blocks, mouse KV in the 15 action blocks only,
# cross-attention cache, VAE decoder feature cache (the keyboard KV and action history are < 1 MB).
PUBLISHED_MG2_BYTES = 0.973e9 + 0.324e9 + 0.047e9 + 1.07e9


def act(keys, mouse=(0, 0), seq=1) -> InputItem:
    return InputItem(session_id="s", seq=seq, kind="action", data=json.dumps({"keys": keys, "mouse": list(mouse)}).encode())


ROAD = SessionInit(prompt="a road")


def run(b: DitWorldBackend, blocks: int, tier: int, seed: int = 5, state=None, init: SessionInit = ROAD,
        inputs: bool = True):
    state = b.init_state(seed, init) if state is None else state
    inputs = [[b.parse_input(act(["w"], (30, -4)))], [], [b.parse_input(act(["a", "shift"]))]] if inputs else [[]] * 3
    return state, [advance(b, state, inputs[i % 3], tier) for i in range(blocks)]


def test_matrix_game_2_size_is_within_5_percent_of_the_published_figure_without_allocating():
    cfg = DitConfig.matrix_game_2()
    spec = state_spec(cfg)  # the spec only: no weights, no state
    total = specs.tensor_bytes(spec)
    assert abs(total - PUBLISHED_MG2_BYTES) / PUBLISHED_MG2_BYTES < 0.05
    assert len(spec["layers"]) == 30 and cfg.tokens == 880
    # the action module's caches exist in blocks 0-14 only, beside a small action-history leaf
    assert [("mouse_k" in layer) for layer in spec["layers"]] == [True] * 15 + [False] * 15
    assert specs.tensor_bytes(spec["layers"][0]) - specs.tensor_bytes(spec["layers"][29]) == pytest.approx(
        2 * 6 * 880 * 1024 * 2, rel=0.01)
    assert spec["actions"].shape == (12, 8)  # 4 × windows_size video frames of keys and mouse
    assert specs.tensor_bytes(spec, "moved") == pytest.approx(1.31e9, rel=0.01)
    assert sum(1 for _, t in specs.leaves(spec) if isinstance(t, specs.TensorSpec) and t.role == "moved") == 122
    # 36 input channels: 16 noise + 4 mask + 16 image latent
    assert cfg.latent_channels + cfg.cond_channels == 36 and spec["image_cond"].role == "static"
    assert specs.tensor_bytes(spec, "rebuildable") > 1.0e9  # the decoder's feature cache is not sent
    assert specs.tensor_bytes(spec, "static") == pytest.approx(0.047e9, rel=0.02)


def test_same_seed_and_inputs_are_bit_exact_and_inputs_matter():
    s1, o1 = run(DitWorldBackend(), 4, 4)
    s2, o2 = run(DitWorldBackend(), 4, 4)
    assert trees_equal(s1, s2) and all(torch.equal(a.frames, b.frames) for a, b in zip(o1, o2, strict=True))
    _, o3 = run(DitWorldBackend(), 4, 4, seed=6)
    assert not torch.equal(o1[-1].frames, o3[-1].frames)
    _, o4 = run(DitWorldBackend(), 4, 4, init=SessionInit(image=RawImage(width=4, height=2, rgb=bytes(range(24)))))
    assert not torch.equal(o1[-1].frames, o4[-1].frames)


def test_tiers_index_the_trained_steps_and_the_first_block_is_shorter():
    b = DitWorldBackend(DitConfig(step_list=(1000, 666, 333)))
    assert b.tiers == (1, 2, 3) and forward_passes(b, 3) == 4  # three steps and the clean pass
    _, outs = run(b, 2, 1)
    assert outs[0].frames.shape[0] == 9 and outs[1].frames.shape[0] == 12  # 1 + 4 + 4, then 3 × 4
    assert b.block_media_s(0) == pytest.approx(9 / 25) and b.media_s_per_block == pytest.approx(12 / 25)
    with pytest.raises(BadRequest):
        b.parse_input(act(["jump"]))


def test_weights_from_safetensors_give_identical_output_and_a_wrong_sha_is_refused(tmp_path):
    random = DitWorldBackend()
    path = tmp_path / "dit.safetensors"
    digest = weights.save(random.w, path)
    loaded = DitWorldBackend(DitConfig(weights_path=str(path), weights_sha256=digest))
    assert loaded.w is not random.w
    _, o1 = run(random, 3, 2)
    _, o2 = run(loaded, 3, 2)
    assert all(torch.equal(a.frames, b.frames) for a, b in zip(o1, o2, strict=True))
    # one copy per host: configs that differ elsewhere share the module
    assert DitWorldBackend(DitConfig(weights_path=str(path), weights_sha256=digest, fps=10.0)).w is loaded.w
    assert DitWorldBackend(DitConfig(vae_cache_role="moved")).w is random.w
    with pytest.raises(ConfigError, match="sha256"):
        DitWorldBackend(DitConfig(weights_path=str(path), weights_sha256="0" * 64))
    with pytest.raises(ConfigError, match="sha256"):
        DitWorldBackend(DitConfig(weights_path=str(path)))
    with pytest.raises(ConfigError, match="lack|unexpected|needs"):
        DitWorldBackend(DitConfig(layers=3, weights_path=str(path), weights_sha256=digest))


def test_ring_writes_dirty_exactly_the_new_frames_fraction():
    """6-frame window, 3-frame blocks: every block rewrites half of each cache's bytes, as a pre-copy
    round sees it (chunk CRCs), and the latent ring its 3 of 12 frames."""
    b = DitWorldBackend()
    c = b.config
    state, _ = run(b, 3, 1)  # the ring has wrapped
    moved = specs.select(state, b.state_spec())
    flat = manifest.flatten(moved)
    slot_bytes = c.tokens * c.mouse_dim * 4  # the smallest frame slot of a per-token cache
    chunks = chunk_grid(flat, slot_bytes // 2)
    import asyncio

    for _ in range(2):
        before = asyncio.run(chunk_crcs(flat, chunks))
        advance(b, state, [], 2)
        after = asyncio.run(chunk_crcs(flat, chunks))
        dirty: dict[str, list[int]] = {}
        for (leaf, _, n), x, y in zip(chunks, before, after, strict=True):
            name = flat.paths[leaf].split("/")[-1]
            dirty.setdefault(name, [0, 0])
            dirty[name][0] += n * (x != y)
            dirty[name][1] += n
        for name in ("k", "v", "mouse_k", "mouse_v"):
            assert dirty[name][0] / dirty[name][1] == 0.5, name
        assert dirty["latents"][0] / dirty["latents"][1] == 3 / c.history_frames
        # the whole moved state: the caches' half, less where a rewrite left bytes as they were (a held key)
        assert 0.4 < sum(d[0] for d in dirty.values()) / sum(d[1] for d in dirty.values()) <= 0.5


@pytest.mark.parametrize("blocks", [2, 7])  # before and after the latent history wraps
def test_a_rebuilt_decoder_cache_equals_the_live_one_and_the_next_blocks_match(blocks):
    b = DitWorldBackend()
    state, _ = run(b, blocks, 2)
    moved = clone_tree(specs.select(state, b.state_spec()))
    rebuilt, _ = complete(b, moved, 5, ROAD)
    assert trees_equal(rebuilt, state)  # vae caches re-derived, cross-attention regenerated
    _, o1 = run(b, 4, 3, state=state)
    _, o2 = run(b, 4, 3, state=rebuilt)
    assert all(torch.equal(x.frames, y.frames) for x, y in zip(o1, o2, strict=True))


def test_config_errors_are_typed():
    with pytest.raises(BadRequest):
        DitWorldBackend(DitConfig(vae_convs=(1, 2)))
    with pytest.raises(msgspec.ValidationError):
        msgspec.msgpack.decode(msgspec.msgpack.encode({"kv_dtype": "int8"}), type=DitConfig)


def test_each_frame_reads_the_action_window_before_it_and_the_history_carries_over():
    """Matrix-Game-2's action history: 4 × 3 video frames per latent frame's window, the block's
    inputs in equal shares over its video frames, the first action repeated before the session."""
    from services.engine_host.backends.action_history import advance_windows

    b = DitWorldBackend()
    A, B = (b.parse_input(act(k, m)) for k, m in ((["w"], (100, 0)), (["a"], (0, -50))))
    row = {x: torch.cat([v.keys, v.mouse]) for x, v in (("A", A), ("B", B))}
    hist = torch.full((12, 8), 9.0)
    windows = advance_windows(hist, [A, B], latent_frames=3, video_per_latent=4, first=True)
    want_seq = [row["A"]] * 12 + [row["A"]] * 6 + [row["B"]] * 6
    assert windows.shape == (3, 12, 8)
    for j in range(3):
        assert torch.equal(windows[j], torch.stack(want_seq[4 * j: 4 * j + 12]))
    assert torch.equal(hist, torch.stack(want_seq[-12:]))
    windows = advance_windows(hist, [], latent_frames=3, video_per_latent=4, first=False)  # B holds
    assert torch.equal(windows[2], torch.stack(want_seq[-4:] + [row["B"]] * 8))
    assert torch.equal(hist, torch.stack([row["B"]] * 12))


def test_a_config_without_action_layers_takes_no_actions_and_has_no_action_leaves():
    b = DitWorldBackend(DitConfig(action_layers=0, cond_channels=0))
    assert b.input_kinds == frozenset() and "actions" not in b.state_spec() and "image_cond" not in b.state_spec()
    assert not any("mouse_k" in layer for layer in b.state_spec()["layers"])
    _, outs = run(b, 2, 1, inputs=False)
    assert outs[1].frames.shape[0] == 12
