"""The whole loop on a real nats-server: HTTP create → admission → placement → fence assign → the
engine host claims → input through fence's ingress → output over the egress WebSocket; then a
move in the middle of the stream (`statefleet session move`), after which the session continues
on the other host byte-identical to an unmigrated control, while a perturbed control diverges."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import aiohttp
import pytest
import torch

from libs import bus, names
from libs.fence.ownership import read_owner
from libs.schemas.base import decode
from libs.schemas.engine import Advance, OutputChunk, SessionInfo, SessionInit
from libs.schemas.motion import MoveReceipt, MoveRequest
from services.admission.service import AdmissionConfig, AdmissionService
from services.engine_host.backends import AvatarBackend, advance
from services.engine_host.output import assemble
from services.engine_host.service import EngineHostConfig, EngineHostService
from services.fence.service import FenceConfig, FenceService
from services.mover.service import MoverConfig, MoverService
from services.placement.service import PlacementConfig, PlacementService
from tests.support.waiting import eventually

SEED, PROMPT, TIER = 11, "a calm narrator", 8
# C3 bulk: blocks run when asked (`advance`), so which items fold into which block is exact.
CONTRACT = {"session_class": "C3", "quality_floor": 1, "determinism": "T0"}


@pytest.fixture
async def fleet(nats_server, tmp_path):
    quiet = dict(log_json=False, heartbeat_s=0.5)
    as_user = nats_server.url_for  # each service under its own NATS user and permissions
    fence = FenceService(FenceConfig(**quiet, nats_url=as_user("fence"), http_port=0))
    await fence.start()
    services = [fence, PlacementService(PlacementConfig(**quiet, nats_url=as_user("placement"))),
                MoverService(MoverConfig(**quiet, nats_url=as_user("mover")))]
    for svc in services[1:]:
        await svc.start()
    hosts = [EngineHostService(EngineHostConfig(**quiet, nats_url=as_user("engine_host", h), host_id=h,
                                                profile_blocks=1, checkpoint_every_s=60.0,
                                                checkpoint_dir=str(tmp_path / "ckpt"), torch_threads=1))
             for h in ("e0", "e1")]
    for h in hosts:
        await h.start()
    admission = AdmissionService(AdmissionConfig(**quiet, nats_url=as_user("admission"), http_port=0,
                                                 ingress_url=f"http://127.0.0.1:{fence.http_port}"))
    await admission.start()
    for _ in range(200):  # admission sees both engine hosts' heartbeats
        if len(admission._live()) == 2:
            break
        await asyncio.sleep(0.05)
    yield admission, {h.host_id: h for h in hosts}
    for svc in [admission, *hosts, *reversed(services)]:
        await svc.stop()


def control_blocks(inputs_per_block: list[list[bytes]], perturb_after: int | None = None) -> list:
    backend = AvatarBackend()
    state = backend.init_state(SEED, SessionInit(prompt=PROMPT))
    out = []
    for i, inputs in enumerate(inputs_per_block, 1):
        out.append(advance(backend, state, inputs, TIER))
        if perturb_after == i:
            leaf = next(v for v in state.values() if isinstance(v, torch.Tensor) and v.is_floating_point())
            leaf.view(-1)[0] += 1e-3
    return out


async def test_create_stream_move_and_continue_byte_identically(fleet, nc, tmp_path):
    admission, hosts = fleet
    async with aiohttp.ClientSession() as http:
        resp = await http.post(f"http://127.0.0.1:{admission.http_port}/v1/sessions",
                               json={"contract": CONTRACT, "backend": "avatar", "seed": SEED, "prompt": PROMPT})
        assert resp.status == 201, await resp.text()
        created = await resp.json()
        sid, first = created["session_id"], created["host_id"]
        auth = {"Authorization": f"Bearer {created['input_token']}"}
        other = next(h for h in hosts if h != first)

        async def claimed_by(host_id: str, version: int):
            view = (await read_owner(nc.jetstream(), sid)).view
            return view.claim == view.owner and view.owner is not None and \
                (view.owner.server_id, view.owner.version) == (host_id, version)

        await eventually(lambda: claimed_by(first, 1))
        got: list[OutputChunk] = []
        ws = await http.ws_connect(created["output_ws_url"], headers=auth)
        reader = asyncio.create_task(_read(ws, got))

        async def say(text: str, host_id: str, cursor: int) -> None:
            async with http.post(created["input_url"], json={"kind": "text", "data": text}, headers=auth) as r:
                assert r.status == 200, await r.text()
            await eventually(lambda: _cursor_is(hosts[host_id], sid, cursor))

        async def run_blocks(host_id: str, blocks: int) -> None:
            await bus.request(nc, names.engine_subject(host_id, "advance"), Advance(session_id=sid, blocks=blocks),
                              SessionInfo, timeout_s=60)

        await say("hello there", first, 1)
        await run_blocks(first, 2)

        # the move, as a user runs it
        env = {**os.environ, "SF_NATS_URL": nc.connected_url.geturl()}
        moved = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "statefleet", "session", "move", sid,
                                                         "--to", other, "--deadline-s", "20"],
                                        capture_output=True, text=True, env=env, timeout=120)
        assert moved.returncode == 0, moved.stdout + moved.stderr
        assert json.loads(moved.stdout)["outcome"] == "committed"
        await eventually(lambda: claimed_by(other, 2))
        assert sid not in hosts[first].runtime.sessions  # the source let go

        await say("general kenobi", other, 2)
        await run_blocks(other, 2)
        await eventually(lambda: _blocks_received(got, 4))
        reader.cancel()
        await ws.close()

        expected = control_blocks([[b"hello there"], [], [b"general kenobi"], []])
        for block, out in enumerate(expected, 1):
            for kind, tensor in (("frames", out.frames), ("audio", out.audio)):
                parts = [c for c in got if c.block == block and c.kind == kind]
                assert torch.equal(assemble(parts), tensor), f"block {block} {kind} differs from the control"
        perturbed = control_blocks([[b"hello there"], [], [b"general kenobi"], []], perturb_after=2)
        assert not torch.equal(perturbed[2].frames, expected[2].frames)

        view = await (await http.get(f"http://127.0.0.1:{admission.http_port}/v1/sessions/{sid}")).json()
        assert (view["owner_server_id"], view["owner_version"], view["claimed"]) == (other, 2, True)
        assert (await http.delete(f"http://127.0.0.1:{admission.http_port}/v1/sessions/{sid}")).status == 204
        await eventually(lambda: _gone(hosts[other], sid))


async def _read(ws, got: list[OutputChunk]) -> None:
    async for msg in ws:
        if msg.type == aiohttp.WSMsgType.BINARY:
            got.append(decode(msg.data, OutputChunk))


async def _cursor_is(host: EngineHostService, sid: str, cursor: int) -> bool:
    return sid in host.runtime.sessions and host.runtime.info(sid).input_cursor == cursor


async def _blocks_received(got: list[OutputChunk], n: int) -> bool:
    """Every part of both kinds (frames, audio) of blocks 1..n has arrived."""
    seen = {(c.block, c.kind, c.part, c.parts) for c in got}
    for block in range(1, n + 1):
        for kind in ("frames", "audio"):
            parts = {(p, total) for b, k, p, total in seen if (b, k) == (block, kind)}
            if not parts or len(parts) != next(iter(parts))[1]:
                return False
    return True


async def _gone(host: EngineHostService, sid: str) -> bool:
    return sid not in host.runtime.sessions


async def test_a_move_from_a_host_that_does_not_own_the_session_is_rejected(fleet, nc):
    admission, hosts = fleet
    async with aiohttp.ClientSession() as http:
        resp = await http.post(f"http://127.0.0.1:{admission.http_port}/v1/sessions",
                               json={"contract": CONTRACT, "backend": "avatar", "seed": SEED, "prompt": PROMPT})
        created = await resp.json()
    sid, owner = created["session_id"], created["host_id"]
    other = next(h for h in hosts if h != owner)
    await eventually(lambda: _cursor_is(hosts[owner], sid, 0))
    receipt = await bus.request(nc, "sf.mover.move", MoveRequest(session_id=sid, source=other, dest=owner,
                                                                 deadline_s=5.0), MoveReceipt, timeout_s=30)
    assert receipt.outcome == "rejected" and f"{other} does not own" in receipt.reason
    view = (await read_owner(nc.jetstream(), sid)).view
    assert (view.owner.server_id, view.owner.version) == (owner, 1)
    assert sid in hosts[owner].runtime.sessions and sid not in hosts[other].runtime.sessions
