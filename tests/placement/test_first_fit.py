"""Capacity-aware first fit (services/placement/core.py)."""

from __future__ import annotations

import pytest

from libs.contracts import Guard
from libs.errors import Rejected
from libs.schemas.placement import PlaceRequest
from services.placement.core import PlacementCore
from tests.admission.fleet import GIB, c1, host, rows


def req(sid: str = "s1", **kw) -> PlaceRequest:
    return PlaceRequest(session_id=sid, backend="world", contract=c1(**kw), guard=Guard(max_sessions=8))


def test_first_fit_in_host_id_order():
    hosts = [host("h2"), host("h0", busy=0.85), host("h1")]
    p = PlacementCore(settle_s=5.0).place(req(), hosts, 1000.0)
    assert p.host_id == "h1" and p.estimate.fits and p.estimate.busy_fraction == pytest.approx(0.1)


def test_placements_fill_a_host_before_the_next():
    core, hosts = PlacementCore(settle_s=5.0), [host("h0", busy=0.6), host("h1")]
    chosen = [core.place(req(f"s{i}"), hosts, 1000.0).host_id for i in range(5)]
    assert chosen == ["h0", "h0", "h0", "h1", "h1"]  # 0.6 + 3 × 0.1 = 0.9 fills h0


def test_retry_of_a_pending_session_returns_the_same_host_without_a_second_reservation():
    core, hosts = PlacementCore(settle_s=5.0), [host("h0", busy=0.75), host("h1")]
    first = core.place(req("s1"), hosts, 1000.0)
    assert core.place(req("s1"), hosts, 1000.5) == first
    assert len(core.reservations.on(hosts[0])) == 1


def test_no_fit_is_a_typed_reject_listing_each_host_reason():
    hosts = [host("h0", busy=0.85), host("h1", free=3 * GIB), host("h2", profile=rows(backend="avatar"))]
    with pytest.raises(Rejected) as e:
        PlacementCore(settle_s=5.0).place(req(), hosts, 1000.0)
    assert e.value.reason == "no_fit" and e.value.hosts == "h0:busy,h1:memory,h2:no_profile"


def test_settled_placements_stop_counting():
    core = PlacementCore(settle_s=5.0)
    core.place(req("s1"), [host("h0", busy=0.75, at=1000.0)], 1000.0)
    with pytest.raises(Rejected):
        core.place(req("s2"), [host("h0", busy=0.75, at=1004.0)], 1004.0)
    # The host's own heartbeat now shows s1; a later placement sees that, not a double count.
    assert core.place(req("s3"), [host("h0", busy=0.75, at=1005.0)], 1005.0).host_id == "h0"
