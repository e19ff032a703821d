"""Fence writes a session's first `sf_sessions` summary as it registers it, with the backend and the
contract's class (issue 22: admission no longer writes the hint, and placement's orphan marks go through fence's
`sf.fence.mark`: fence is its one writer)."""

from __future__ import annotations

import asyncio

import msgspec

from libs import bus, names
from libs.contracts import Contract
from libs.fence import ownership
from libs.schemas.base import decode, encode
from libs.schemas.common import SessionNotice, SessionSummary
from libs.schemas.fence import (
    CloseReply,
    CloseRequest,
    MarkReply,
    MarkRequest,
    RegisterReply,
    RegisterRequest,
)


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


async def mark(nc, sid: str, version: int, orphaned: str = "") -> str:
    return (await bus.request(nc, names.FENCE_MARK, MarkRequest(session_id=sid, version=version, orphaned=orphaned),
                              MarkReply)).state


async def notices(nc, sid: str) -> asyncio.Queue[SessionNotice]:
    heard: asyncio.Queue[SessionNotice] = asyncio.Queue()

    async def on_notice(msg) -> None:
        await heard.put(decode(msg.data, SessionNotice))

    await nc.subscribe(names.notice_subject(sid), cb=on_notice)
    await nc.flush()
    return heard


async def test_an_orphan_mark_lands_only_at_the_version_placement_saw(nc, fence):
    """Placement marks a session it finds no room for through fence (`sf.fence.mark`), the hint's one
    writer. A mark at the owner version the log shows lands with its reason, and its client hears it once
    (issue 29: re-queued visibly, never silently stuck), not again as the hosts' reasons change; a late one
    (the session was reassigned since placement looked) or one on a closed session leaves the log's own state."""
    heard = await notices(nc, "h3")
    await bus.request(nc, names.FENCE_REGISTER, RegisterRequest(session_id="h3", backend="toy", seed=1),
                      RegisterReply)
    first = await ownership.assign(nc, "h3", "e0")
    assert await mark(nc, "h3", first.version, "waiting for room (e1 busy)") == "orphaned"
    s = await summary(nc, "h3")
    assert (s.state, s.reason, s.owner_server_id, s.backend) == ("orphaned", "waiting for room (e1 busy)", "e0", "toy")
    notice = await asyncio.wait_for(heard.get(), 10)
    assert (notice.session_id, notice.kind, notice.reason) == ("h3", "orphaned", "waiting for room (e1 busy)")
    assert await mark(nc, "h3", first.version, "waiting for room (e1 slots)") == "orphaned"
    assert (await summary(nc, "h3")).reason == "waiting for room (e1 slots)"
    assert await mark(nc, "h3", first.version) == "assigned"  # cleared: the log's state, no reason
    assert ((await summary(nc, "h3")).state, (await summary(nc, "h3")).reason) == ("assigned", "")

    second = await ownership.assign(nc, "h3", "e1")
    assert await mark(nc, "h3", first.version, "waiting for room (no live host)") == "assigned"
    s = await summary(nc, "h3")
    assert (s.state, s.owner_server_id, s.owner_version) == ("assigned", "e1", second.version)

    await bus.request(nc, names.FENCE_CLOSE, CloseRequest(session_id="h3"), CloseReply)
    assert await mark(nc, "h3", second.version, "waiting for room (no live host)") == "closed"
    # Only the one notice: the reason's change, the clear and the late marks told nothing (a marker sent
    # after them all is the next thing heard)
    await nc.publish(names.notice_subject("h3"), encode(SessionNotice(session_id="h3", kind="resumed", reason="end")))
    assert (await asyncio.wait_for(heard.get(), 10)).reason == "end"


async def test_a_shed_mark_keeps_its_kind_in_the_summary_and_tells_the_client_and_a_resumed_mark_clears_it(nc, fence):
    """Overload relief's marks (issue 23): the summary says the session is suspended as `capacity_lost` and why,
    the session's client hears it as a typed `SessionNotice`, and the resume clears the mark and is told too."""
    heard = await notices(nc, "h4")
    await bus.request(nc, names.FENCE_REGISTER, RegisterRequest(session_id="h4", backend="toy", seed=1),
                      RegisterReply)
    first = await ownership.assign(nc, "h4", "e0")
    why = "capacity_lost: e0's device measured past its limit; re-queued until a device has room"
    reply = await bus.request(nc, names.FENCE_MARK, MarkRequest(session_id="h4", version=first.version, shed=why,
                                                                shed_kind="capacity_lost"), MarkReply)
    assert reply.state == "suspended"
    s = await summary(nc, "h4")
    assert (s.state, s.shed, s.reason) == ("suspended", "capacity_lost", why)
    notice = await asyncio.wait_for(heard.get(), 10)
    assert (notice.session_id, notice.kind, notice.reason) == ("h4", "capacity_lost", why)

    late = await bus.request(nc, names.FENCE_MARK, MarkRequest(session_id="h4", version=first.version + 1,
                                                               resumed=True), MarkReply)
    assert late.state == "assigned" and heard.empty()  # not the version the log shows: nothing told
    await bus.request(nc, names.FENCE_MARK, MarkRequest(session_id="h4", version=first.version, resumed=True),
                      MarkReply)
    s = await summary(nc, "h4")
    assert (s.state, s.shed, s.reason) == ("assigned", "", "")
    assert (await asyncio.wait_for(heard.get(), 10)).kind == "resumed"
