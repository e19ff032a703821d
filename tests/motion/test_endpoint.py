"""The six verbs over NATS between two real endpoints: TCP and in-process, stop-and-copy and pre-copy, codecs."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from libs import bus
from libs.errors import BadRequest, Conflict, IntegrityError, NotFound
from libs.motion import crc, inprocess, manifest
from libs.motion.endpoint import MotionEndpoint
from libs.schemas.motion import (
    Manifest,
    RegisterState,
    SlotDone,
    SlotRequest,
    Verified,
)
from tests.support.dicthost import DictHost, make_tree, tree_bytes
from tests.support.moves import admit, finish, migrate, verb


@pytest.fixture
async def pair(nc):
    a, b = DictHost(), DictHost()
    ea, eb = MotionEndpoint(nc, "a", a), MotionEndpoint(nc, "b", b)
    await ea.start()
    await eb.start()
    yield a, b, ea, eb
    await ea.stop()
    await eb.stop()


@pytest.mark.parametrize("path,codec,planes", [("tcp", "none", False), ("tcp", "zstd", True), ("tcp", "lz4", False),
                                               ("inprocess", "none", False)])
async def test_stop_and_copy_installs_the_exact_bytes(nc, pair, path, codec, planes):
    a, b, _, eb = pair
    a.add("s", make_tree(11), b"desc")
    want = tree_bytes(a.trees["s"])
    if path == "tcp":
        inprocess.local_receivers.pop(eb.data_addr)
    m = await bus.request(nc, verb("a", "register_state"), RegisterState(session_id="s"), Manifest)
    v = await admit(nc, m, "m1")
    assert v.admissible and len(v.token) == 32
    r = await migrate(nc, v, "m1", codec=codec, byte_planes=planes)
    assert r.manifest.fingerprint == m.fingerprint and r.rounds == [1.0]
    if codec != "none":
        assert r.wire_bytes < m.total_bytes  # bf16/fp16 planes and int64 tokens compress
    assert b.installs == 0 and "s" not in b.trees  # staged only, nothing live yet
    await finish(nc, "m1", r.manifest)
    assert tree_bytes(b.trees["s"]) == want and b.descriptors["s"] == b"desc" and "s" not in a.trees


async def test_precopy_converges_while_the_session_keeps_generating(nc, pair):
    a, b, _, eb = pair
    a.add("s", make_tree(12, leaf_bytes=256 << 10))
    inprocess.local_receivers.pop(eb.data_addr)
    stop = asyncio.Event()
    runner = asyncio.create_task(a.run("s", stop, block_s=0.01))
    m = await bus.request(nc, verb("a", "register_state"), RegisterState(session_id="s"), Manifest)
    v = await admit(nc, m, "m2", dirty_rate_bps=1e6)
    r = await migrate(nc, v, "m2", mode="precopy", round_cap=3, converge_fraction=0.0)
    assert r.rounds[0] == 1.0 and 2 <= len(r.rounds) <= 4
    assert all(0.0 <= f <= 1.0 for f in r.rounds)
    # The session ran on during pre-copy; the final round's manifest is the state at the freeze ...
    assert r.manifest.fingerprint != m.fingerprint
    # ... and the source stays frozen there until the move is decided: no block runs meanwhile.
    cursor = a.trees["s"]["control"]["cursor"]
    await asyncio.sleep(0.1)
    assert a.trees["s"]["control"]["cursor"] == cursor
    await finish(nc, "m2", r.manifest)
    stop.set()
    blocks = await runner
    assert blocks > 0 and "s" not in a.trees
    assert (await bus.request(nc, verb("b", "register_state"), RegisterState(session_id="s"), Manifest)
            ).fingerprint == r.manifest.fingerprint


async def test_verbs_in_the_wrong_state_are_typed_errors_and_change_nothing(nc, pair):
    a, b, ea, eb = pair
    a.add("s", make_tree(13))
    with pytest.raises(NotFound):
        await bus.request(nc, verb("a", "register_state"), RegisterState(session_id="nope"), Manifest)
    m = await bus.request(nc, verb("a", "register_state"), RegisterState(session_id="s"), Manifest)
    v = await admit(nc, m, "m3")
    again = await admit(nc, m, "m3b")
    assert not again.admissible and "already staged" in again.reason
    slot = SlotRequest(session_id="s", move_id="m3", manifest=m)
    ok = await bus.request(nc, verb("b", "verify"), slot, Verified)  # nothing arrived yet
    assert not ok.ok and "nothing staged" in ok.reason
    r = await migrate(nc, v, "m3")
    with pytest.raises(Conflict):
        await migrate(nc, v, "m3")  # the same move cannot be sent twice
    await bus.request(nc, verb("b", "rollback"), slot, SlotDone)
    await bus.request(nc, verb("a", "rollback"), SlotRequest(session_id="s", move_id="m3"), SlotDone)
    with pytest.raises(NotFound):
        await bus.request(nc, verb("b", "commit"), SlotRequest(session_id="s", move_id="m3", manifest=r.manifest),
                          SlotDone)
    assert b.installs == 0 and "s" in a.trees and not eb.slots and not ea.outgoing


async def test_a_structure_only_register_sizes_a_move_but_can_verify_or_install_nothing(nc, pair):
    a, b, _, eb = pair
    a.add("s", make_tree(16))
    want = tree_bytes(a.trees["s"])
    full = await bus.request(nc, verb("a", "register_state"), RegisterState(session_id="s"), Manifest)
    m = await bus.request(nc, verb("a", "register_state"), RegisterState(session_id="s", fingerprint=False), Manifest)
    assert (m.total_bytes, m.topology, m.control) == (full.total_bytes, full.topology, full.control)
    assert m.fingerprint == 0 and all(leaf.crc32c == 0 for leaf in m.leaves)
    v = await admit(nc, m, "m5")
    r = await migrate(nc, v, "m5")
    assert r.manifest.fingerprint == full.fingerprint  # migrate's manifest is taken over the sent bytes
    structural = SlotRequest(session_id="s", move_id="m5", manifest=m)
    for name, reply in (("verify", Verified), ("commit", SlotDone)):
        with pytest.raises(BadRequest):
            await bus.request(nc, verb("b", name), structural, reply)
    assert b.installs == 0
    await finish(nc, "m5", r.manifest)
    assert tree_bytes(b.trees["s"]) == want


@pytest.mark.parametrize("path", ["tcp", "inprocess"])
async def test_a_staged_byte_flipped_after_verify_is_caught_by_commit(nc, pair, path):
    a, b, _, eb = pair
    a.add("s", make_tree(17))
    want = tree_bytes(a.trees["s"])
    if path == "tcp":
        inprocess.local_receivers.pop(eb.data_addr)
    m = await bus.request(nc, verb("a", "register_state"), RegisterState(session_id="s", fingerprint=False), Manifest)
    v = await admit(nc, m, "m6")
    r = await migrate(nc, v, "m6")
    slot = SlotRequest(session_id="s", move_id="m6", manifest=r.manifest)
    assert (await bus.request(nc, verb("b", "verify"), slot, Verified)).ok
    staged = crc.byte_view(eb.slots["m6"].tensors[2])
    staged[staged.numel() // 2] ^= 0x10  # the staged copy changes after verify said yes
    with pytest.raises(IntegrityError):
        await bus.request(nc, verb("b", "commit"), slot, SlotDone)
    assert b.installs == 0 and "s" not in b.trees
    await bus.request(nc, verb("b", "rollback"), slot, SlotDone)
    await bus.request(nc, verb("a", "rollback"), SlotRequest(session_id="s", move_id="m6"), SlotDone)
    assert tree_bytes(a.trees["s"]) == want  # the source stayed authoritative


@pytest.mark.parametrize("path", ["tcp", "inprocess"])
async def test_verify_refuses_a_staged_copy_whose_crcs_disagree_with_the_manifest(nc, pair, path):
    a, b, _, eb = pair
    a.add("s", make_tree(18))
    if path == "tcp":
        inprocess.local_receivers.pop(eb.data_addr)
    m = await bus.request(nc, verb("a", "register_state"), RegisterState(session_id="s"), Manifest)
    v = await admit(nc, m, "m7")
    r = await migrate(nc, v, "m7")
    # A manifest that is consistent in itself but names another CRC for one leaf than was staged.
    leaves = list(r.manifest.leaves)
    leaves[1] = msgspec.structs.replace(leaves[1], crc32c=leaves[1].crc32c ^ 1)
    other = msgspec.structs.replace(r.manifest, leaves=leaves, fingerprint=manifest.whole_fingerprint(
        r.manifest.topology, r.manifest.control, [x.crc32c for x in leaves]))
    manifest.check_consistent(other)
    said = await bus.request(nc, verb("b", "verify"), SlotRequest(session_id="s", move_id="m7", manifest=other),
                             Verified)
    assert not said.ok and "differ from the manifest" in said.reason
    # The slot is dropped: not even the true manifest can commit it now.
    with pytest.raises(Conflict):
        await bus.request(nc, verb("b", "commit"), SlotRequest(session_id="s", move_id="m7", manifest=r.manifest),
                          SlotDone)
    assert b.installs == 0 and "s" not in b.trees


async def test_inadmissible_move_arms_nothing(nc, pair):
    a, _, _, eb = pair
    a.add("s", make_tree(14))
    m = await bus.request(nc, verb("a", "register_state"), RegisterState(session_id="s"), Manifest)
    v = await admit(nc, m, "m4", horizon_s=1e-5)
    assert not v.admissible and "horizon" in v.reason and not v.token and not eb.slots


async def test_source_stays_frozen_until_decided_and_thaws_by_itself_if_never(nc, pair, monkeypatch):
    from libs.motion import endpoint as endpoint_mod

    monkeypatch.setattr(endpoint_mod, "SLOT_GRACE_S", 0.2)
    a, _, ea, _ = pair
    a.add("s", make_tree(15))
    stop = asyncio.Event()
    m = await bus.request(nc, verb("a", "register_state"), RegisterState(session_id="s"), Manifest)
    v = await admit(nc, m, "m9")
    await migrate(nc, v, "m9", deadline_s=0.5)
    runner = asyncio.create_task(a.run("s", stop, block_s=0.005))
    await asyncio.sleep(0.2)
    assert a.trees["s"]["control"]["cursor"] == 0  # frozen: no coordinator has decided the move yet
    for _ in range(100):  # the horizon (0.5 s) plus the grace passes: the source thaws and runs on
        if a.trees["s"]["control"]["cursor"] > 0:
            break
        await asyncio.sleep(0.05)
    stop.set()
    assert await runner > 0 and not ea.frozen and "m9" not in ea.outgoing
