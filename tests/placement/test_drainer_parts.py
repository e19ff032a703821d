"""The drainer built from config and fakes of its parts (tests/placement/parts.py): every session leaves
the host by a live move, or by a hand-over when the move is refused, and the reservations follow
fence's log."""

from __future__ import annotations

import pytest

from libs.errors import NotFound
from libs.schemas.placement import HostRequest
from tests.placement.parts import Parts
from tests.support.fleet_rows import host


async def test_live_moves_empty_the_host_and_it_ends_drained():
    parts = Parts([host("h0", busy=0.2), host("h1"), host("h2")])
    for sid in ("a", "b"):
        parts.owners.own(sid, "h0")
        parts.reserved("h0", sid)
        parts.relocation.commits.add(sid)
    report = await parts.drainer().drain(HostRequest(host_id="h0"))
    assert [(o.session_id, o.outcome) for o in report.outcomes] == [("a", "moved"), ("b", "moved")]
    assert (report.state, report.remaining) == ("drained", 0)
    for sid in ("a", "b"):
        dest = next(o.dest for o in report.outcomes if o.session_id == sid)
        assert await parts.owners.owner_is(sid, dest) and dest != "h0"
        assert parts.reservations.holding(sid) == {dest}
    assert parts.owners.assigns == []  # no hand-over was needed


async def test_a_refused_live_move_is_handed_over_at_the_version_the_drain_saw():
    parts = Parts([host("h0"), host("h1")])
    parts.owners.own("a", "h0", version=3)
    parts.reserved("h0", "a")
    report = await parts.drainer().drain(HostRequest(host_id="h0"))
    assert [(o.session_id, o.outcome, o.dest) for o in report.outcomes] == [("a", "handed_over", "h1")]
    assert parts.owners.assigns == [("a", "h1", 3)]
    assert parts.reservations.holding("a") == {"h1"}
    assert report.state == "drained"


async def test_a_refused_hand_over_keeps_the_session_and_the_host_draining():
    parts = Parts([host("h0"), host("h1")])
    parts.owners.own("a", "h0", version=3)
    parts.reserved("h0", "a")
    assign = parts.owners.assign

    async def moved_on(session_id, host_id, *, expect_version, incarnation):
        # The session moves on (a new claim on h0) every time after the drain read it.
        parts.owners.own(session_id, "h0", parts.owners.views[session_id].owner.version + 1)
        await assign(session_id, host_id, expect_version=expect_version, incarnation=incarnation)

    parts.owners.assign = moved_on  # type: ignore[method-assign]
    report = await parts.drainer().drain(HostRequest(host_id="h0"))
    assert [(o.session_id, o.outcome) for o in report.outcomes] == [("a", "failed")]
    assert await parts.owners.owner_is("a", "h0")
    assert parts.reservations.holding("a") == {"h0"}  # the receiver's reservation went
    assert (report.state, report.remaining) == ("draining", 1)


async def test_an_unknown_host_is_refused_and_nothing_is_written():
    parts = Parts([host("h0")])
    with pytest.raises(NotFound):
        await parts.drainer().drain(HostRequest(host_id="nope"))
    assert parts.view.host_records == {}


async def test_a_pinned_session_leaves_for_a_host_at_its_thread_count():
    """The block journal says "a" runs at 2 threads: the drain sends it to the one host at 2 (h2), though
    the policy alone spreads onto the emptier h1; "b", recorded at no count, goes where the policy says."""
    import msgspec

    def at(h, threads):
        return msgspec.structs.replace(h, threads=threads)

    parts = Parts([at(host("h0"), 2), at(host("h1"), 1), at(host("h2", busy=0.3, sessions=3), 2)])
    for sid in ("a", "b"):
        parts.owners.own(sid, "h0")
        parts.reserved("h0", sid)
        parts.relocation.commits.add(sid)
    parts.owners.thread_counts["a"] = 2
    report = await parts.drainer().drain(HostRequest(host_id="h0"))
    assert {o.session_id: (o.outcome, o.dest) for o in report.outcomes} == {
        "a": ("moved", "h2"), "b": ("moved", "h1")}
