"""The fleet controller on a real stack: the failover tests' stack (nats-server, fence, two placement
instances, the mover; engine hosts as processes) with the controller turned on per test."""

from __future__ import annotations

import msgspec
import pytest

from libs import bus, names
from libs.contracts import Contract
from libs.fence.ownership import assign
from libs.schemas.engine import Advance, SessionInfo
from libs.schemas.fence import RegisterReply, RegisterRequest
from libs.schemas.motion import Manifest, RegisterState
from libs.schemas.placement import Placement, PlaceRequest
from tests.support.stack import Stack
from tests.support.waiting import eventually


@pytest.fixture
async def stack(nats_server, nc, tmp_path):
    s = Stack(nc, nats_server.url, tmp_path)
    yield s
    await s.stop()


def holder(stack: Stack):
    """The placement instance holding the fleet lease (None while none does)."""
    return next((p for p in stack.placements if p.fleet.tenure.held), None)


def configure(stack: Stack, **fields) -> None:
    """Change the controller's settings on every placement instance (read afresh every round)."""
    for p in stack.placements:
        for k, v in fields.items():
            setattr(p.config, k, v)


async def create(stack: Stack, sid: str, contract: Contract, backend: str = "avatar", seed: int = 3) -> str:
    """Register, place and assign a session with this contract, as admission does; the host it went to."""
    req = RegisterRequest(session_id=sid, backend=backend, seed=seed, prompt="narrator",
                          contract=msgspec.msgpack.encode(contract), tier=1)
    stack.tokens[sid] = (await bus.request(stack.nc, names.FENCE_REGISTER, req, RegisterReply)).token
    placement = await bus.request(stack.nc, names.PLACEMENT_PLACE, PlaceRequest(
        session_id=sid, backend=backend, contract=contract), Placement)
    await assign(stack.nc, sid, placement.host_id, incarnation=placement.incarnation)
    await eventually(lambda: stack.claimed_by(sid, placement.host_id))
    return placement.host_id


async def fingerprint(stack: Stack, host_id: str, sid: str) -> int:
    """The whole-state CRC32C of the session's live tree at a block boundary (the mover's manifest)."""
    m = await bus.request(stack.nc, names.engine_subject(host_id, "register_state"),
                          RegisterState(session_id=sid), Manifest, timeout_s=10)
    return m.fingerprint


async def advance(stack: Stack, host_id: str, sid: str, blocks: int) -> SessionInfo:
    return await bus.request(stack.nc, names.engine_subject(host_id, "advance"),
                             Advance(session_id=sid, blocks=blocks), SessionInfo, timeout_s=30)
