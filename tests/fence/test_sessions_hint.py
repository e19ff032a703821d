"""Fence writes a session's first `sf_sessions` summary as it registers it, with the backend and the
contract's class (issue 22: admission no longer writes the hint; only fence and placement do)."""

from __future__ import annotations

import msgspec

from libs import bus, names
from libs.contracts import Contract
from libs.schemas.base import decode
from libs.schemas.common import SessionSummary
from libs.schemas.fence import RegisterReply, RegisterRequest


async def summary(nc, sid: str) -> SessionSummary:
    kv = await nc.jetstream().key_value(names.SESSIONS_BUCKET)
    return decode((await kv.get(sid)).value, SessionSummary)


async def test_registering_writes_the_first_summary_with_the_contracts_class(nc, fence):
    contract = Contract(session_class="C2a", quality_floor=1, determinism="T1", period_ms=200.0)
    await bus.request(nc, names.FENCE_REGISTER, RegisterRequest(
        session_id="h1", backend="toy", seed=1, contract=msgspec.msgpack.encode(contract)), RegisterReply)
    s = await summary(nc, "h1")
    assert (s.backend, s.session_class, s.state) == ("toy", "C2a", "pending")


async def test_a_contract_fence_cannot_read_leaves_the_class_empty_and_registers_anyway(nc, fence):
    await bus.request(nc, names.FENCE_REGISTER, RegisterRequest(
        session_id="h2", backend="toy", seed=1, contract=b"\xc1not msgpack"), RegisterReply)
    s = await summary(nc, "h2")
    assert (s.backend, s.session_class, s.state) == ("toy", "", "pending")
