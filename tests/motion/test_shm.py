"""Same-machine moves through shared memory: chosen from the machine identity, verified as any move,
and nothing left mapped or linked when either side is killed mid-copy."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import signal
import sys

import pytest
import torch

from libs import bus
from libs.errors import IntegrityError, Unavailable
from libs.motion import inprocess, manifest, pool, route
from libs.motion.endpoint import MotionEndpoint
from libs.motion.sender import chunk_grid, leaf_crcs_from_chunks
from libs.motion.shm import ShmChannel
from libs.motion.slot import staged_digest
from libs.schemas.motion import Manifest, RegisterState, SlotRequest, Verified
from tests.motion.shm_peer import CHUNK, state
from tests.support.dicthost import DictHost, make_tree, tree_bytes
from tests.support.moves import admit, finish, migrate, verb


@pytest.fixture
async def apart(nc):
    """Two endpoints in this process that must talk over the data plane, as two engine hosts would."""
    a, b = DictHost(), DictHost()
    ea, eb = MotionEndpoint(nc, "a", a), MotionEndpoint(nc, "b", b, staging_bytes=4 << 20)
    await ea.start()
    await eb.start()
    inprocess.local_receivers.pop(eb.data_addr)
    yield a, b, ea, eb
    await ea.stop()
    await eb.stop()


def route_of(**kw) -> str:
    base = dict(in_process=False, same_machine=True, source_device="cpu", dest_device="cpu", mode="stop_and_copy")
    return route.choose(kw.pop("asked", "auto"), **(base | kw))


def test_the_route_follows_the_machine_and_the_devices():
    assert route_of() == "shm"
    assert route_of(same_machine=False) == "tcp"
    assert route_of(in_process=True) == "inprocess"
    assert route_of(asked="tcp") == "tcp"
    assert route_of(asked="mooncake") == "mooncake"
    assert route_of(source_device="cuda") == "shm"  # a device source writes into a host slot
    assert route_of(source_device="cuda", dest_device="cuda") == "shm"  # CUDA IPC, frozen
    assert route_of(source_device="cuda", dest_device="cuda", mode="precopy") == "tcp"
    assert route_of(source_device="cpu", dest_device="cuda") == "tcp"
    with pytest.raises(Unavailable):
        route_of(asked="shm", same_machine=False)


@pytest.mark.parametrize("mode", ["stop_and_copy", "precopy"])
async def test_same_machine_move_goes_by_shared_memory_into_the_pool(nc, apart, mode):
    a, b, ea, eb = apart
    a.add("s", make_tree(5, leaf_bytes=96 << 10), b"d")
    want = tree_bytes(a.trees["s"])
    m = await bus.request(nc, verb("a", "register_state"), RegisterState(session_id="s"), Manifest)
    v = await admit(nc, m, "x1")
    assert v.machine == ea.machine != "" and v.device == "cpu"
    r = await migrate(nc, v, "x1", dest_machine=v.machine, dest_device=v.device, mode=mode)
    assert r.transport == "shm" and r.manifest.fingerprint == m.fingerprint
    ok = await bus.request(nc, verb("b", "verify"), SlotRequest(session_id="s", move_id="x1", manifest=r.manifest),
                           Verified)
    assert ok.ok and ok.staging == "pool"
    await finish(nc, "x1", r.manifest)
    assert tree_bytes(b.trees["s"]) == want and "s" not in a.trees
    assert eb.pool.free_bytes < eb.pool.capacity  # the installed state lives in the pool ...
    await b.drop_session("s")
    gc.collect()
    assert eb.pool.free_bytes == eb.pool.capacity  # ... and goes back when the session does


async def test_another_machine_goes_by_tcp_and_a_small_pool_says_so(nc, apart):
    a, _, _, _ = apart
    a.add("s", make_tree(6, leaf_bytes=1 << 20))  # ~7 MiB: more than the 4 MiB pool
    m = await bus.request(nc, verb("a", "register_state"), RegisterState(session_id="s"), Manifest)
    v = await admit(nc, m, "x2")
    r = await migrate(nc, v, "x2", dest_machine="another-boot/another-host", dest_device="cpu")
    assert r.transport == "tcp"
    ok = await bus.request(nc, verb("b", "verify"), SlotRequest(session_id="s", move_id="x2", manifest=r.manifest),
                           Verified)
    assert ok.ok and ok.staging.startswith("fresh: the staging pool has")


class Scribbling(ShmChannel):
    """Damages the first chunk in the receiver's memory after taking its CRC, before its frame goes out."""

    def _copy(self, views, bounce, c):
        value = super()._copy(views, bounce, c)
        if c[1] == 0 and c[0] == 0:
            self.dst[0][5] ^= 0xFF
        return value


async def one_round(nc, host: DictHost, move_id: str, kind: type[ShmChannel], *, bounce: bool):
    """Open a `kind` channel to b's data plane for a's session "s" and move it in one round; returns the
    channel (still open) and either (chunk CRCs, the receiver's digest) or the exception that ended it."""
    flat = manifest.flatten(host.trees["s"])
    m = await bus.request(nc, verb("a", "register_state"), RegisterState(session_id="s"), Manifest)
    v = await admit(nc, m, move_id)
    ch = await kind.open(v.data_addr, v.token, manifest.build("s", flat, [0] * len(flat.tensors)), 32 << 10)
    try:
        crcs = await ch.put_many([manifest.crc.byte_view(t) for t in flat.tensors], chunk_grid(flat, 32 << 10),
                                 bounce=bounce)
        await ch.end_round()
        return ch, (crcs, await ch.finish())
    except (IntegrityError, Unavailable) as e:
        return ch, e


async def test_a_damaged_shared_chunk_is_refused_and_its_region_waits_for_the_sender(nc, apart):
    a, b, _, eb = apart
    a.add("s", make_tree(7))
    # a live (pre-copy) round: the sender maps the receiver's region and writes into it
    ch, got = await one_round(nc, a, "x3", Scribbling, bounce=True)
    assert isinstance(got, (IntegrityError, Unavailable))  # refused by its CRC (maybe before the sender is done)
    gc.collect()
    eb.pool.take(0)
    assert eb.pool.free_bytes < eb.pool.capacity  # the failed slot's region: still mapped by the sender
    await ch.close()
    eb.pool.take(0)
    assert eb.pool.free_bytes == eb.pool.capacity and b.installs == 0


class Thawing(ShmChannel):
    """A source that changes a byte of the first chunk after taking its CRC, before the receiver reads it."""

    def _checksum(self, views, c):
        value = super()._checksum(views, c)
        if c[0] == 0 and c[1] == 0:
            views[0][5] ^= 0xFF
        return value


async def test_a_frozen_round_is_pulled_and_a_changed_source_is_refused_at_once(nc, apart):
    a, b, _, eb = apart
    a.add("s", make_tree(7))
    ch, got = await one_round(nc, a, "x4", Thawing, bounce=False)
    assert isinstance(got, (IntegrityError, Unavailable))  # the receiver's CRC of what it read != the sender's
    assert ch.plan is not None and ch.plan.pull and ch.mapping is None  # pulled: nothing of the receiver mapped
    await ch.close()
    gc.collect()
    eb.pool.take(0)
    assert eb.pool.free_bytes == eb.pool.capacity and b.installs == 0  # no peer mapped it: back at once


class Impostor(ShmChannel):
    """Announces a pull whose proof the receiver cannot read back, as when the pid it names is another
    process there (another pid namespace, a reused pid) or the kernel forbids the read."""

    def _pull_plan(self, views):
        plan = super()._pull_plan(views)
        plan.secret = bytes(b ^ 0xFF for b in plan.secret)
        return plan


async def test_a_refused_pull_falls_back_to_writes_into_the_mapped_region(nc, apart):
    a, _, _, _ = apart
    a.add("s", make_tree(7))
    ch, got = await one_round(nc, a, "x5", Impostor, bounce=False)
    assert ch.plan is not None and not ch.plan.pull and ch.mapping is not None
    await ch.close()
    flat = manifest.flatten(a.trees["s"])
    crcs, digest = got
    assert digest == staged_digest(leaf_crcs_from_chunks(flat, chunk_grid(flat, 32 << 10), crcs))


# ---------------------------------------------------------------- kill either side mid-copy


def shm_names() -> set[str]:
    return set(os.listdir("/dev/shm"))


def memfd_maps(pid: int) -> list[str]:
    with open(f"/proc/{pid}/maps") as f:
        return [line for line in f if "memfd:statefleet" in line]


async def peer(*args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(sys.executable, "-m", "tests.motion.shm_peer", *args,
                                                stdout=asyncio.subprocess.PIPE, cwd=os.getcwd())


@pytest.mark.parametrize("way", ["push", "pull"])
async def test_killed_sender_leaves_nothing_and_the_region_returns(way):
    from libs.motion.receiver import DataPlane
    from libs.motion.slot import ShadowSlot

    before = shm_names()
    arena = pool.StagingPool(64 << 20)
    slots: list[ShadowSlot] = []

    def claim(token: str) -> ShadowSlot:
        slots.append(ShadowSlot("s", "m", token, 32 << 20, torch.device("cpu"), lease_s=60, staging=arena))
        return slots[-1]

    plane = DataPlane(claim)
    addr = await plane.start()
    try:
        proc = await peer("sender", addr, "cd" * 16, "32", way)
        assert (await asyncio.wait_for(proc.stdout.readline(), 60)).strip() == b"half"
        if way == "push":
            assert pool.peer_mappings(arena.inode, arena.base_ptr)  # mid-copy: the sender maps the slot's region
            slots[0].fail("lease expired")  # the receiver gives up first: the region must not be reused yet
            slots.clear()
            gc.collect()
            arena.take(0)
            assert arena.free_bytes < arena.capacity
        else:  # the receiver reads the sender's memory: nothing of the slot is mapped anywhere else
            assert not pool.peer_mappings(arena.inode, arena.base_ptr)
            slots.clear()
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
        if plane._conns:  # the receiver's connection sees the hang-up and lets go of the slot
            await asyncio.wait(set(plane._conns), timeout=30)
        gc.collect()
        arena.take(0)  # a take sweeps the quarantine: the dead sender maps nothing any more
        assert arena.free_bytes == arena.capacity and not pool.peer_mappings(arena.inode, arena.base_ptr)
    finally:
        await plane.stop()
    assert shm_names() == before


@pytest.mark.parametrize("live", [True, False])
async def test_killed_receiver_leaves_the_sender_nothing_mapped(live):
    before = shm_names()
    gc.collect()
    # regions this process maps for other reasons (another test's pool not yet collected) are not ours
    others = set(memfd_maps(os.getpid()))
    proc = await peer("receiver", str(32 << 20))
    hello = json.loads(await asyncio.wait_for(proc.stdout.readline(), 60))
    flat = state(32)
    ch = await ShmChannel.open(hello["addr"], hello["token"], manifest.build("s", flat, [0]), CHUNK)
    chunks = chunk_grid(flat, CHUNK)
    views = [manifest.crc.byte_view(t) for t in flat.tensors]
    await ch.put_many(views, chunks[:len(chunks) // 2], bounce=live)
    assert bool(set(memfd_maps(os.getpid())) - others) == live  # mid-copy: a live round writes into the mapped region
    proc.send_signal(signal.SIGKILL)
    await proc.wait()
    with pytest.raises((Unavailable, IntegrityError)):
        await ch.put_many(views, chunks[len(chunks) // 2:], bounce=live)
        await ch.finish()
    await ch.close()
    gc.collect()
    assert set(memfd_maps(os.getpid())) <= others and shm_names() == before
