"""Orphans, drains and concurrent placers on a real stack (engine hosts as processes; fake heartbeats for the race)."""

from __future__ import annotations

import asyncio
import re
import time

import msgspec

from libs import bus, names
from libs.contracts import Guard
from libs.errors import Rejected
from libs.schemas.base import decode, encode
from libs.schemas.common import SessionNotice, SessionSummary
from libs.schemas.placement import DrainReport, HostRecord, HostRequest, Placement, PlaceRequest
from statefleet.status import print_status
from tests.support.fleet_rows import c1, host
from tests.support.invariants import check_log, read_log
from tests.support.waiting import eventually

ONE_EACH = Guard(max_sessions=1)


async def summary(stack, sid: str) -> SessionSummary:
    kv = await stack.js.key_value(names.SESSIONS_BUCKET)
    return decode((await kv.get(sid)).value, SessionSummary)


async def summary_state(stack, sid: str) -> str:
    return (await summary(stack, sid)).state


async def test_no_room_orphans_the_session_until_a_host_joins(stack, capsys):
    await stack.start(max_sessions_per_host=1)
    await stack.engines_up("e0", "e1")
    assert (await stack.create("o0", ONE_EACH)).host_id == "e0"
    assert (await stack.create("o1", ONE_EACH)).host_id == "e1"
    await stack.send("o0", 1, 3)
    await eventually(lambda: stack.consumed("o0", 3))
    heard: asyncio.Queue[SessionNotice] = asyncio.Queue()

    async def on_notice(msg) -> None:
        await heard.put(decode(msg.data, SessionNotice))

    await stack.nc.subscribe(names.notice_subject("o0"), cb=on_notice)
    await stack.nc.flush()
    stack.engines["e0"].kill()

    async def orphaned():
        return await summary_state(stack, "o0") == "orphaned"

    await eventually(orphaned, 20)
    # Visibly re-queued, never silently stuck: the summary and `statefleet status` say why, host by host.
    reason = (await summary(stack, "o0")).reason
    # e1, the one live host, is full (its one slot; or its device reads busy on a loaded machine)
    assert re.fullmatch(r"waiting for room \(e1 (slots|busy)\)", reason), reason
    notice = await asyncio.wait_for(heard.get(), 10)  # and its client hears it (issue 29)
    assert notice.kind == "orphaned" and re.fullmatch(r"waiting for room \(e1 (slots|busy)\)", notice.reason)
    capsys.readouterr()
    await print_status(stack.url)
    line = next(x for x in capsys.readouterr().out.splitlines() if x.split()[:1] == ["o0"])
    assert "orphaned" in line and line.endswith(reason), line
    await stack.send("o0", 4, 5)  # accepted input is kept while orphaned
    await stack.engines_up("e2")
    view = await eventually(lambda: stack.claimed_by("o0", "e2", min_version=2), 20)
    assert view.owner.version == 2
    await eventually(lambda: stack.consumed("o0", 5))
    assert await summary_state(stack, "o0") == "serving"
    assert (await summary(stack, "o0")).reason == ""  # the reason went with the state
    check_log(await read_log(stack.js, "o0"))


async def test_drain_moves_every_session_off_and_stops_placing_there(stack):
    await stack.start()
    await stack.engines_up("e0", "e1", "e2")
    sids = [f"d{i}" for i in range(3)]
    for sid in sids:
        assert (await stack.create(sid)).host_id == "e0"
        await stack.send(sid, 1, 2)
    for sid in sids:
        await eventually(lambda sid=sid: stack.consumed(sid, 2))
    report = await bus.request(stack.nc, names.PLACEMENT_DRAIN, HostRequest(host_id="e0"), DrainReport,
                               timeout_s=120)
    assert report.state == "drained" and report.remaining == 0
    assert sorted(o.session_id for o in report.outcomes) == sids
    assert all(o.outcome in ("moved", "handed_over") and o.dest in ("e1", "e2") for o in report.outcomes)
    for sid in sids:
        await stack.send(sid, 3, 4)
        view = await eventually(lambda sid=sid: stack.owner(sid))
        assert view.owner.server_id in ("e1", "e2")
        await eventually(lambda sid=sid: stack.consumed(sid, 4))
        check_log(await read_log(stack.js, sid))
    # A drained host takes no new session: d9 goes elsewhere, or (on a machine so loaded that e1 and e2
    # measure themselves full) is refused with e0 named drained, never placed on it.
    try:
        placed = await stack.create("d9")
        assert placed.host_id != "e0"
        extra = ["d9"]
    except Rejected as e:
        assert "e0:drained" in e.fields.get("hosts", ""), e.fields
        extra = []
    # A horizon no move can meet makes every live move inadmissible: e1's sessions are handed over instead.
    for p in stack.placements:  # the drainer's live moves take their horizon from the relocation part
        p.drainer.relocation.deadline_s = 1e-4
    on_e1 = sorted([sid for sid in [*sids, *extra] if (await stack.owner(sid)).owner.server_id == "e1"])
    report = await bus.request(stack.nc, names.PLACEMENT_DRAIN, HostRequest(host_id="e1"), DrainReport,
                               timeout_s=120)
    assert report.state == "drained" and [o.session_id for o in report.outcomes] == on_e1
    assert all(o.outcome == "handed_over" and o.dest == "e2" and "rejected" in o.detail for o in report.outcomes)
    for sid in on_e1:
        n = 4 if sid != "d9" else 0
        await stack.send(sid, n + 1, n + 2)
        await eventually(lambda sid=sid, n=n: stack.consumed(sid, n + 2))
        check_log(await read_log(stack.js, sid))


async def test_concurrent_placements_through_two_instances_never_over_commit(stack):
    """30 placements at once, spread over both placement instances, onto one host with room for nine."""
    await stack.start()
    kv = await bus.ensure_kv(stack.js, names.ENGINES_BUCKET)
    await kv.put("h0", encode(msgspec.structs.replace(host("h0", at=time.time()), incarnation="i0")))
    await eventually(lambda: _sees(stack, "h0"))
    guard = Guard(max_sessions=64)

    async def place(i: int):
        try:
            return await bus.request(stack.nc, names.PLACEMENT_PLACE, PlaceRequest(
                session_id=f"r{i}", backend="world", contract=c1(), guard=guard), Placement)
        except Rejected:
            return None

    placed = [p for p in await asyncio.gather(*(place(i) for i in range(30))) if p is not None]
    assert len(placed) == 9  # 0.1 of the device each, 0.9 below the guard
    record = decode((await (await stack.js.key_value(names.CAPACITY_BUCKET)).get("h0")).value, HostRecord)
    assert sorted(record.sessions) == sorted(p.session_id for p in placed)


async def _sees(stack, host_id: str) -> bool:
    return all(p.liveness.entry(host_id) is not None for p in stack.placements)
