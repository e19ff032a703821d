"""Manifest, flatten and CRC combination: the fingerprint binds every byte and every control value."""

from __future__ import annotations

import crc32c
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from libs.errors import BadRequest
from libs.motion import crc, manifest
from tests.support.dicthost import make_tree, tree_bytes


@given(st.lists(st.binary(max_size=3000), min_size=1, max_size=6))
def test_combine_equals_crc_of_the_concatenation(parts):
    crcs = [crc32c.crc32c(p) for p in parts]
    assert crc.combine_all(crcs, [len(p) for p in parts]) == crc32c.crc32c(b"".join(parts))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 20000), min_size=1, max_size=5), st.integers(256, 4096), st.booleans())
def test_leaf_crcs_in_pieces_equal_one_pass_over_each_leaf(sizes, piece, strided):
    """Leaves larger than the piece size are checksummed in pieces on every worker and combined."""
    import asyncio

    gen = torch.Generator().manual_seed(sum(sizes) + piece)
    leaves = [torch.randint(0, 255, (n * 2,), dtype=torch.uint8, generator=gen) for n in sizes]
    if strided:  # non-contiguous leaves take the one-task path
        leaves = [t[::2] for t in leaves]
    before = manifest._CRC_PIECE_BYTES
    manifest._CRC_PIECE_BYTES = piece
    try:
        got = asyncio.run(manifest.leaf_crcs(leaves))
    finally:
        manifest._CRC_PIECE_BYTES = before
    assert got == [crc32c.crc32c(t.contiguous().numpy().tobytes()) for t in leaves]


async def test_flatten_roundtrip_keeps_structure_and_control_values():
    tree = make_tree(1)
    flat = manifest.flatten(tree)
    back = manifest.unflatten(flat.control, [t.clone() for t in flat.tensors])
    assert back["control"] == tree["control"]
    assert tree_bytes(back) == tree_bytes(tree)
    assert [p for p in flat.paths][:2] == ["kv/0/k", "kv/0/v"]


async def test_manifest_changes_with_any_byte_or_control_value():
    tree = make_tree(2)
    m = await manifest.register("s", tree)
    manifest.check_consistent(m)
    tree["kv"][1]["v"].view(-1)[7] += 1
    m2 = await manifest.register("s", tree)
    assert m2.fingerprint != m.fingerprint and m2.topology == m.topology
    tree["control"]["cursor"] += 1
    m3 = await manifest.register("s", tree)
    assert m3.fingerprint != m2.fingerprint and m3.topology == m.topology
    tree["latent"] = tree["latent"][:-1]
    assert (await manifest.register("s", tree)).topology != m.topology


async def test_bad_trees_and_inconsistent_manifests_are_bad_requests():
    with pytest.raises(BadRequest, match="unsupported type"):
        manifest.flatten({"x": object()})
    with pytest.raises(BadRequest, match="not a str"):
        manifest.flatten({"x": {1: torch.zeros(1)}})
    m = await manifest.register("s", make_tree(3))
    forged = manifest.Manifest(**{**{f: getattr(m, f) for f in m.__struct_fields__}, "total_bytes": 5})
    with pytest.raises(BadRequest, match="total_bytes"):
        manifest.check_consistent(forged)
    leaves = list(m.leaves)
    leaves[0] = manifest.Leaf(path=leaves[0].path, dtype=leaves[0].dtype, shape=[1], nbytes=leaves[0].nbytes,
                              crc32c=leaves[0].crc32c)
    with pytest.raises(BadRequest, match="nbytes"):
        manifest.check_consistent(manifest.Manifest(**{**{f: getattr(m, f) for f in m.__struct_fields__},
                                                       "leaves": leaves}))
