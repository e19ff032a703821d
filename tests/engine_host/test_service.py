"""The engine host over a real NATS server: registration, verbs, output chunks, checkpoint failover."""

from __future__ import annotations

import asyncio
import json

import pytest
import torch
from nats.js.errors import KeyNotFoundError

from libs import bus, names
from libs.checkpoint import trees_equal
from libs.errors import Conflict, NotFound, SchemaError, Timeout, Unavailable
from libs.schemas.base import decode
from libs.schemas.common import EngineEntry, InputItem
from libs.schemas.engine import (
    Advance,
    CheckpointRef,
    HostStatus,
    OpenSession,
    OutputChunk,
    RestoreSession,
    SessionInfo,
    SessionInit,
    SessionMetrics,
    SessionRef,
    StatusRequest,
)
from services.engine_host.backends import AvatarBackend, advance
from services.engine_host.output import assemble
from services.engine_host.service import EngineHostConfig, EngineHostService


async def start_host(url: str, host_id: str, tmp_path) -> EngineHostService:
    cfg = EngineHostConfig(nats_url=url, host_id=host_id, heartbeat_s=0.5, profile_blocks=1,
                           checkpoint_dir=str(tmp_path / "ckpt"), checkpoint_inline_max_bytes=1 << 16)
    svc = EngineHostService(cfg)
    await svc.start()
    return svc


@pytest.fixture
async def host(nats_server, tmp_path):
    svc = await start_host(nats_server.url, "h1", tmp_path)
    yield svc
    await svc.stop()


def subject(verb: str, host_id: str = "h1") -> str:
    return names.engine_subject(host_id, verb)


async def test_registers_with_measured_profile_and_load(host, nc):
    kv = await nc.jetstream().key_value(names.ENGINES_BUCKET)
    entry = decode((await kv.get("h1")).value, EngineEntry)
    assert entry.device == "cpu" and entry.memory_bytes > 0
    # the thread count its blocks run at, which placement prefers a pinned T0/T1 session's host by
    assert entry.threads == torch.get_num_threads() > 0
    rows = {(r.backend, r.tier): r for r in entry.profile}
    assert set(rows) == ({("world", t) for t in (1, 2, 4)} | {("avatar", t) for t in (1, 2, 4, 8)}
                         | {("dit", t) for t in (1, 2, 3, 4)} | {("talking_head", t) for t in (1, 2)})
    assert {b.name for b in entry.backends} == {"world", "avatar", "dit", "talking_head"}
    assert rows[("talking_head", 1)].input_kinds == ["audio", "clear", "segment_end"]
    dit = next(b for b in entry.backends if b.name == "dit")
    assert dit.rebuildable_bytes > 0 and dit.static_bytes > 0 and rows[("dit", 4)].moved_bytes == dit.moved_bytes
    assert 0 < rows[("dit", 4)].dirty_bytes_per_block < dit.moved_bytes
    # what a move's rebuild-or-send choice and admission's init-input check read
    assert rows[("dit", 4)].rebuild_ms > 0 and rows[("world", 4)].rebuild_ms == 0
    assert rows[("dit", 1)].init_kinds == dit.init_kinds == ["image", "prompt"] and rows[("world", 1)].init_kinds == ["prompt"]
    assert all(r.quantum_ms > 0 and r.block_ms >= r.quantum_ms and r.state_bytes > 0 for r in rows.values())
    await bus.request(nc, subject("open"), OpenSession(session_id="p", backend="avatar", seed=1,
                                                       session_class="C1", period_ms=400), SessionInfo)
    await asyncio.sleep(1.2)
    entry = decode((await kv.get("h1")).value, EngineEntry)
    assert entry.sessions == 1 and entry.busy_fraction > 0 and entry.state_bytes_resident > 0


async def test_session_verbs_and_output_chunks_over_nats(host, nc):
    got: list[OutputChunk] = []
    sub = await bus.subscribe_events(nc, names.output_subject("av"), OutputChunk, lambda c: _append(got, c))
    info = await bus.request(nc, subject("open"), OpenSession(session_id="av", backend="avatar", seed=5,
                                                              prompt="narrator"), SessionInfo)
    assert info.state == "running" and info.tier == 8
    # Input reaches a host only through fence's lease (test_fenced.py); here it goes straight to the runtime.
    item = InputItem(session_id="av", seq=1, kind="text", data=json.dumps("hello world").encode())
    assert await host.runtime.apply_input(item) == 1
    with pytest.raises(Conflict):
        await host.runtime.apply_input(item)
    # an item the backend refuses is skipped and reported on the output stream, not raised
    assert await host.runtime.apply_input(InputItem(session_id="av", seq=2, kind="action", data=b"{}")) == 2
    assert host.runtime.info("av").rejected_inputs == 1
    with pytest.raises(Unavailable):  # there is no input verb to bypass the fence with
        await bus.request(nc, subject("input"), item, SessionInfo, timeout_s=2)
    with pytest.raises(NotFound):
        await bus.request(nc, subject("advance"), Advance(session_id="ghost"), SessionInfo, timeout_s=30)
    resp = await nc.request(subject("advance"), b"\xc1 not msgpack", timeout=5)
    assert resp.headers[bus.ERROR_HEADER] == SchemaError.code
    info = await bus.request(nc, subject("advance"), Advance(session_id="av", blocks=2), SessionInfo, timeout_s=30)
    assert info.blocks_done == 2 and info.consumed_seq == 2  # item 2 was skipped: consumed with the block
    await nc.flush()
    await asyncio.sleep(0.1)
    # the frontend reassembles exactly what the backend computes locally for the same seed and input
    ref = AvatarBackend()
    state = ref.init_state(5, SessionInit(prompt="narrator"))
    expect = [advance(ref, state, [b"hello world"], 8), advance(ref, state, [], 8)]
    for block, out in enumerate(expect, 1):
        frames = assemble([c for c in got if c.block == block and c.kind == "frames"])
        audio = assemble([c for c in got if c.block == block and c.kind == "audio"])
        assert torch.equal(frames, out.frames) and torch.equal(audio, out.audio)
    metrics = await bus.request(nc, subject("metrics"), SessionRef(session_id="av"), SessionMetrics)
    assert metrics.blocks == 2 and metrics.rtf_p95 > 0
    status = await bus.request(nc, subject("status"), StatusRequest(), HostStatus)
    assert [s.session_id for s in status.sessions] == ["av"] and status.pipeline.slot_leaks == 0
    for verb in ("suspend", "resume"):
        info = await bus.request(nc, subject(verb), SessionRef(session_id="av"), SessionInfo)
    assert info.state == "running"
    closed = await bus.request(nc, subject("close"), SessionRef(session_id="av"), SessionInfo)
    assert closed.state == "closed"
    with pytest.raises(NotFound):
        await bus.request(nc, subject("info"), SessionRef(session_id="av"), SessionInfo)
    await sub.unsubscribe()


async def _append(out: list, c: OutputChunk) -> None:
    out.append(c)


@pytest.mark.parametrize("backend,blocks", [("avatar", 2), ("world", 2)])  # avatar: object store, world: file
async def test_checkpoint_restores_bit_exactly_on_another_host(host, nc, nats_server, tmp_path, backend, blocks):
    await bus.request(nc, subject("open"), OpenSession(session_id="f", backend=backend, seed=8), SessionInfo)
    await bus.request(nc, subject("advance"), Advance(session_id="f", blocks=blocks), SessionInfo,
                      timeout_s=30)
    ref = await bus.request(nc, subject("checkpoint"), SessionRef(session_id="f"), CheckpointRef)
    assert ref.location == ("object" if backend == "avatar" else "file") and ref.blocks_done == blocks
    await bus.request(nc, subject("advance"), Advance(session_id="f", blocks=1), SessionInfo, timeout_s=30)
    ref2 = await bus.request(nc, subject("checkpoint"), SessionRef(session_id="f"), CheckpointRef)
    with pytest.raises(NotFound):  # the older checkpoint was replaced
        await host.runtime.checkpoints.manifest(ref.key)
    other = await start_host(nats_server.url, "h2", tmp_path)
    try:
        info = await bus.request(nc, subject("restore", "h2"), RestoreSession(session_id="f", key=ref2.key),
                                 SessionInfo)
        assert info.blocks_done == blocks + 1
        assert trees_equal(other.runtime.state_tree("f"), host.runtime.state_tree("f"))
        for h in ("h1", "h2"):
            await bus.request(nc, subject("advance", h), Advance(session_id="f", blocks=2), SessionInfo, timeout_s=30)
        assert trees_equal(other.runtime.state_tree("f"), host.runtime.state_tree("f"))
        with pytest.raises(NotFound):
            await bus.request(nc, subject("restore", "h2"), RestoreSession(session_id="g", key="nope"), SessionInfo)
    finally:
        await other.stop()


async def test_statefleet_engines_shows_session_metrics(host, nc, nats_server, capsys):
    from statefleet.engines import print_engines

    await bus.request(nc, subject("open"), OpenSession(session_id="w", backend="world", seed=1), SessionInfo)
    await bus.request(nc, subject("advance"), Advance(session_id="w", blocks=3), SessionInfo, timeout_s=30)
    assert await print_engines(nats_server.url) == 0
    out = capsys.readouterr().out
    assert "h1 cpu" in out and "slot_leaks=0" in out
    line = next(x for x in out.splitlines() if x.strip().startswith("w "))
    assert "blocks 3" in line and "rtf p95" in line
    assert await print_engines(nats_server.url, as_json=True) == 0
    assert json.loads(capsys.readouterr().out)[0]["sessions"][0]["session_id"] == "w"


async def test_host_rides_out_a_nats_restart(nats_server, tmp_path, nc):
    svc = await start_host(nats_server.url, "h9", tmp_path)
    try:
        await bus.request(nc, subject("open", "h9"), OpenSession(session_id="r", backend="world", seed=2),
                          SessionInfo)
        nats_server.restart()
        client = await bus.connect(nats_server.url, name="after-restart")
        try:
            for _ in range(100):  # the host reconnects by itself and its subscriptions come back
                try:
                    info = await bus.request(client, subject("advance", "h9"), Advance(session_id="r", blocks=2),
                                             SessionInfo, timeout_s=1)
                    break
                except (Unavailable, Timeout):
                    await asyncio.sleep(0.1)
            assert info.blocks_done == 2
            kv = await client.jetstream().key_value(names.ENGINES_BUCKET)
            for _ in range(50):  # and heartbeats resume
                try:
                    if decode((await kv.get("h9")).value, EngineEntry).sessions == 1:
                        break
                except KeyNotFoundError:
                    pass
                await asyncio.sleep(0.1)
            assert decode((await kv.get("h9")).value, EngineEntry).sessions == 1
        finally:
            await client.close()
    finally:
        await svc.stop()


async def test_a_long_verb_of_one_session_does_not_hold_up_another(host, nc):
    for sid in ("slow", "fast"):
        await bus.request(nc, subject("open"), OpenSession(session_id=sid, backend="world", seed=1), SessionInfo)
    async with host.runtime.block_boundary("slow"):  # "slow" cannot run a block while this is held
        slow = asyncio.create_task(bus.request(nc, subject("advance"), Advance(session_id="slow"), SessionInfo,
                                               timeout_s=20))
        await asyncio.sleep(0.2)
        info = await bus.request(nc, subject("advance"), Advance(session_id="fast", blocks=2), SessionInfo, timeout_s=30)
        assert info.blocks_done == 2 and not slow.done()
    assert (await slow).blocks_done == 1


def test_cpu_free_memory_is_what_the_kernel_can_hand_out_not_memfree():
    """Page cache is reclaimable: a host whose RAM is mostly cache still has room for sessions."""
    import torch

    from services.engine_host.service import device_memory

    meminfo = dict(line.split(":", 1) for line in open("/proc/meminfo"))
    available = int(meminfo["MemAvailable"].split()[0]) * 1024
    total, free = device_memory(torch.device("cpu"))
    assert free <= total
    assert abs(free - available) < 0.05 * total  # sampled a moment apart
