"""Moves of real-shaped state: a dit session of ≥ 512 MiB moved same-host (in-process) and over TCP
is bit-identical and its next 20 blocks equal an unmoved control's; only moved leaves travel; a
pre-copy of a generating session never resends the whole state."""

from __future__ import annotations

import asyncio
import json

import msgspec
import pytest
import torch

from libs import bus, names
from libs.checkpoint import CheckpointStore, trees_equal
from libs.errors import Conflict
from libs.motion import inprocess
from libs.motion.endpoint import MotionEndpoint
from libs.schemas.common import InputItem
from libs.schemas.engine import OpenSession, OutputChunk, RawImage, SessionInit
from libs.schemas.motion import (
    AdmitMove,
    AdmitVerdict,
    Manifest,
    Migrate,
    MigrateResult,
    RegisterState,
    SlotDone,
    SlotRequest,
    Verified,
)
from services.engine_host import profile
from services.engine_host.backends import spec as specs
from services.engine_host.backends.base import advance
from services.engine_host.backends.dit import DitConfig
from services.engine_host.output import assemble
from services.engine_host.runtime import EngineRuntime

SEED = 9
# The default small model with a rolling window long enough that the session's moved state is
# 512 MiB; attention reads only the filled slots, so a block stays cheap on 2 cores.
BIG = DitConfig(window_frames=135_400)


class Frames:
    def __init__(self) -> None:
        self.chunks: list[OutputChunk] = []

    async def __call__(self, subject: str, payload: bytes) -> None:
        self.chunks.append(msgspec.msgpack.decode(payload, type=OutputChunk))

    def blocks(self) -> list[torch.Tensor]:
        ids = sorted({c.block for c in self.chunks if c.kind == "frames"})
        return [assemble([c for c in self.chunks if c.block == b and c.kind == "frames"]) for b in ids]


def action(seq: int) -> InputItem:
    keys = [["w"], ["a", "shift"], [], ["d"]][seq % 4]
    return InputItem(session_id="s", seq=seq, kind="action",
                     data=json.dumps({"keys": keys, "mouse": [seq * 7 % 40 - 20, 3]}).encode())


async def move(nc, src: str, dst: str, move_id: str, **kw) -> MigrateResult:
    m = await bus.request(nc, names.engine_subject(src, "register_state"),
                          RegisterState(session_id="s", fingerprint=False), Manifest)
    v = await bus.request(nc, names.engine_subject(dst, "admit"),
                          AdmitMove(session_id="s", move_id=move_id, state_bytes=m.total_bytes, dirty_rate_bps=0.0,
                                    horizon_s=120.0, bandwidth_bps=1e9), AdmitVerdict)
    assert v.admissible, v.reason
    r = await bus.request(nc, names.engine_subject(src, "migrate"),
                          Migrate(session_id="s", move_id=move_id, dest_host=dst, dest_addr=v.data_addr, token=v.token,
                                  deadline_s=120.0, **kw), MigrateResult, timeout_s=150)
    slot = SlotRequest(session_id="s", move_id=move_id, manifest=r.manifest)
    assert (await bus.request(nc, names.engine_subject(dst, "verify"), slot, Verified, timeout_s=60)).ok
    await bus.request(nc, names.engine_subject(dst, "commit"), slot, SlotDone, timeout_s=60)
    await bus.request(nc, names.engine_subject(src, "commit"), SlotRequest(session_id="s", move_id=move_id), SlotDone)
    return r


@pytest.fixture
async def hosts(nc):
    made = []
    for h in ("a", "b"):
        out = Frames()
        # "rebuild": these moves carry the declared `moved` leaves only, whatever a rebuild costs here
        rt = EngineRuntime("cpu", host_id=h, publish=out, backend_configs={"dit": msgspec.msgpack.encode(BIG)},
                           rebuild_policy="rebuild")
        rt.frames = out
        await rt.start()
        ep = MotionEndpoint(nc, h, rt)
        await ep.start()
        made.append((rt, ep))
    yield made
    for rt, ep in made:
        await ep.stop()
        await rt.stop()


async def test_a_512_mib_session_moves_same_host_and_over_tcp_and_continues_like_its_control(nc, hosts):
    (a, ea), (b, eb) = hosts
    await a.open(OpenSession(session_id="s", backend="dit", seed=SEED, prompt="a harbour", tier=1,
                             session_class="C3"))
    backend = a.backend("dit")
    control = backend.init_state(SEED, SessionInit(prompt="a harbour"))
    want = [advance(backend, control, [backend.parse_input(action(seq))], 1).frames for seq in (1, 2, 3)]
    for seq in (1, 2, 3):
        await a.apply_input(action(seq))
        await a.advance("s", 1)
    r1 = await move(nc, "a", "b", "same-host")  # b's data plane is in this process: tensor copies
    assert r1.manifest.total_bytes >= 512 << 20
    assert r1.manifest.total_bytes == specs.tensor_bytes(backend.state_spec(), "moved")
    assert not any(leaf.path.startswith("vae") or "cross" in leaf.path for leaf in r1.manifest.leaves)
    inprocess.local_receivers.pop(ea.data_addr)  # back to a over TCP
    r2 = await move(nc, "b", "a", "tcp")
    assert r2.manifest.fingerprint == r1.manifest.fingerprint  # no block ran in between: same bytes
    assert trees_equal(a.sessions.get("s").state, control)  # rebuilt and regenerated leaves included
    want += [advance(backend, control, [backend.parse_input(action(seq))], 1).frames for seq in range(4, 24)]
    for seq in range(4, 24):
        await a.apply_input(action(seq))
        await a.advance("s", 1)
    assert not b.frames.blocks()  # b only held the session between the moves
    served = a.frames.blocks()
    assert len(served) == 23 and all(torch.equal(x, y) for x, y in zip(served, want, strict=True))


async def test_a_precopy_of_a_generating_session_resends_only_what_blocks_wrote(nc, hosts):
    (a, _), (b, eb) = hosts
    small = msgspec.msgpack.encode(DitConfig())
    for rt in (a, b):
        rt.backends.configs["dit"] = small
    inprocess.local_receivers.pop(eb.data_addr)
    await a.open(OpenSession(session_id="s", backend="dit", seed=SEED, tier=1, session_class="C3"))
    await a.advance("s", 3)
    running = asyncio.create_task(a.advance("s", 1000))
    await asyncio.sleep(0.2)
    # chunks of one per-token frame slot: a round resends exactly the frames the blocks since wrote
    r = await move(nc, "a", "b", "pre", mode="precopy", round_cap=4, converge_fraction=0.0,
                   chunk_bytes=DitConfig().tokens * DitConfig().mouse_dim * 4)
    with pytest.raises(Conflict):
        await running  # the source session was frozen for the move, then dropped
    assert r.rounds[0] == 1.0 and len(r.rounds) >= 2
    # a ring of 6 frames, 3 per block: what a round resends is below the whole state (a shift by clone: 1.0)
    assert all(f < 1.0 for f in r.rounds[1:]), r.rounds
    assert b.info("s").blocks_done > 3


@pytest.mark.parametrize(("wire_bps", "sends"), [(1e18, True), (1.0, False)])
async def test_a_move_sends_the_rebuildable_cache_when_its_measured_rebuild_costs_more_than_its_bytes(
        nc, wire_bps, sends):
    a, b = (EngineRuntime("cpu", host_id=h, move_wire_bps=wire_bps) for h in ("a", "b"))
    eps = [MotionEndpoint(nc, rt.host_id, rt) for rt in (a, b)]
    for rt, ep in zip((a, b), eps, strict=True):
        await rt.start()
        await ep.start()
    try:
        backend = a.backend("dit")
        spec = backend.state_spec()
        a.seed_costs(profile.measure(backend, blocks=1, warmup=1))  # the source has timed a rebuild
        assert a.rebuilds.rebuild_s(backend) > 0 and b.rebuilds.rebuild_s(backend) is None
        await a.open(OpenSession(session_id="s", backend="dit", seed=SEED, prompt="a lake", tier=1,
                                 session_class="C3"))
        await a.advance("s", 5)  # the latent history has wrapped
        r = await move(nc, "a", "b", "choice")
        assert any(leaf.path.startswith("vae") for leaf in r.manifest.leaves) == sends
        assert r.manifest.total_bytes == specs.tensor_bytes(spec, "moved", *(["rebuildable"] if sends else []))
        assert (b.rebuilds.rebuild_s(backend) is None) == sends  # the destination rebuilt only what was not sent
        control = backend.init_state(SEED, SessionInit(prompt="a lake"))
        for _ in range(5):
            advance(backend, control, [], 1)
        assert trees_equal(b.sessions.get("s").state, control)
        await b.advance("s", 2)
        for _ in range(2):
            advance(backend, control, [], 1)
        assert trees_equal(b.sessions.get("s").state, control)
    finally:
        for rt, ep in zip((a, b), eps, strict=True):
            await ep.stop()
            await rt.stop()


async def test_a_checkpoint_keeps_only_moved_leaves_and_a_restore_rebuilds_the_rest(nc, tmp_path):
    store = CheckpointStore(await bus.ensure_object_store(nc.jetstream(), "ckpt_dit"), tmp_path / "ckpt")
    a, b = (EngineRuntime("cpu", host_id=h, checkpoints=store) for h in ("a", "b"))
    for rt in (a, b):
        await rt.start()
    try:
        image = RawImage(width=5, height=4, rgb=bytes(range(60)))  # the static leaves' source, with the seed
        await a.open(OpenSession(session_id="s", backend="dit", seed=SEED, image=image, tier=2, session_class="C3"))
        await a.advance("s", 5)  # the latent history (4 blocks) has wrapped
        ref = await a.checkpoint("s")
        assert ref.total_bytes == specs.tensor_bytes(a.backend("dit").state_spec(), "moved")
        await b.restore("s", ref.key)
        assert trees_equal(b.sessions.get("s").state, a.sessions.get("s").state)  # cross_k/v from the image too
        assert not trees_equal(b.sessions.get("s").state, a.backend("dit").init_state(SEED, SessionInit()))
        for rt in (a, b):
            await rt.advance("s", 2)
        assert trees_equal(b.sessions.get("s").state, a.sessions.get("s").state)
    finally:
        for rt in (a, b):
            await rt.stop()
