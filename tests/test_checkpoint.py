"""The checkpoint store: bit-exact round trips in both locations, fail-closed on damaged bytes."""

from __future__ import annotations

import pytest
import torch

from libs import bus
from libs.checkpoint import CheckpointStore, clone_tree, trees_equal
from libs.errors import BadRequest, ConfigError, IntegrityError, NotFound


def sample_tree() -> dict:
    g = torch.Generator().manual_seed(3)
    return {"kv": torch.randn((2, 3, 5), generator=g), "pos": torch.arange(7, dtype=torch.int64),
            "mask": torch.tensor([True, False, True]), "half": torch.randn(5, generator=g).half(),
            "nested": [{"x": torch.ones(3, dtype=torch.uint8)}, 4], "seed": 9, "phase": 0.25, "name": "w"}


@pytest.fixture
async def store(nc, tmp_path):
    objects = await bus.ensure_object_store(nc.jetstream(), "ckpt_test")
    return CheckpointStore(objects, tmp_path / "ckpt", inline_max_bytes=100)


async def test_round_trip_in_object_store_is_bit_exact(store):
    tree = sample_tree()
    small = {"a": torch.arange(4, dtype=torch.int16), "n": 1}
    m = await store.put("s1.b1", small, b"desc")
    assert m.location == "object"
    got, desc = await store.get("s1.b1")
    assert desc == b"desc" and trees_equal(got, small)
    m = await store.put("s1.b2", tree, b"d2")
    assert m.location == "file"  # over inline_max_bytes
    got, desc = await store.get("s1.b2")
    assert desc == b"d2" and trees_equal(got, tree)


async def test_snapshot_is_taken_at_put(store):
    tree = {"a": torch.zeros(4)}
    await store.put("k", tree, b"")
    tree["a"].add_(1)
    got, _ = await store.get("k")
    assert torch.equal(got["a"], torch.zeros(4))


async def test_corrupted_file_fails_closed(store, tmp_path):
    tree = sample_tree()
    await store.put("big", tree, b"")
    path = tmp_path / "ckpt" / "big.ckpt"
    raw = bytearray(path.read_bytes())
    raw[10] ^= 0x01
    path.write_bytes(bytes(raw))
    with pytest.raises(IntegrityError):
        await store.get("big")
    path.write_bytes(bytes(raw[:-1]))
    with pytest.raises(IntegrityError):
        await store.get("big")


async def test_corrupted_object_fails_closed(store):
    await store.put("small", {"a": torch.arange(8, dtype=torch.int8)}, b"")
    data = bytearray((await store.objects.get("small.data")).data)
    data[0] ^= 0xFF
    await store.objects.put("small.data", bytes(data))
    with pytest.raises(IntegrityError):
        await store.get("small")


async def test_missing_bad_key_and_no_root(store, nc):
    with pytest.raises(NotFound):
        await store.get("nope")
    with pytest.raises(BadRequest):
        await store.put("../etc", {"a": torch.zeros(1)}, b"")
    with pytest.raises(BadRequest):
        await store.put("k2", {"a": object()}, b"")
    no_root = CheckpointStore(store.objects, None, inline_max_bytes=4)
    with pytest.raises(ConfigError):
        await no_root.put("k3", {"a": torch.zeros(8)}, b"")
    with pytest.raises(NotFound):
        await store.delete("nope")


async def test_delete_removes_both_parts(store, tmp_path):
    await store.put("gone", sample_tree(), b"")
    await store.delete("gone")
    assert not (tmp_path / "ckpt" / "gone.ckpt").exists()
    with pytest.raises(NotFound):
        await store.get("gone")


def test_clone_tree_is_a_deep_copy():
    tree = sample_tree()
    copy = clone_tree(tree)
    assert trees_equal(tree, copy)
    copy["kv"][0, 0, 0] += 1
    assert not trees_equal(tree, copy)


async def test_data_without_a_manifest_is_not_a_checkpoint(store, tmp_path):
    """A writer that died between data and manifest leaves nothing a reader would take."""
    await store.objects.put("half.data", b"\x00" * 16)
    (tmp_path / "ckpt").mkdir(exist_ok=True)
    (tmp_path / "ckpt" / "half2.ckpt").write_bytes(b"\x00" * 16)
    for key in ("half", "half2"):
        with pytest.raises(NotFound):
            await store.get(key)
