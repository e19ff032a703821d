"""Overload relief (services/placement/policy/overload.py): a device measured past its limit sheds load in the
issue's order (move to another device with room; suspend C3, then C2; a C1 only as `capacity_lost`), until the
rest fits, and a device within its limit is left alone. Decisions only: pure, no clock."""

from __future__ import annotations

import msgspec

from libs.contracts import Contract
from services.placement.policy import Move, Suspend, decide
from tests.placement.policy_fleet import PARAMS, fleet, measured, sess, shared


def of(cls: str, s):
    window = {"C2a": {"deadline_ms": 100.0}, "C3": {}}[cls]
    return msgspec.structs.replace(s, contract=Contract(session_class=cls, quality_floor=8, determinism="T1", **window))


def relief(f):
    d = decide(f, PARAMS, rebalancing=False, scaling=False, offload=False, relieving=True)
    return [a for a in d.actions if isinstance(a, Move | Suspend)]


def test_lower_classes_are_suspended_first_and_only_until_the_rest_fits():
    # priced 0.4 (two 0.2 shares), measured 1.2: each priced share runs 3x; 0.3 above the 0.9 limit
    f = measured(fleet({"h0": [sess("a", "h0"), of("C2a", sess("b", "h0")), of("C3", sess("c", "h0"))]}), h0=1.2)
    got = relief(f)
    assert got == [Suspend(session_id="c", host_id="h0", reason="overload"),
                   Suspend(session_id="b", host_id="h0", reason="overload")]  # the C1 session keeps running


def test_a_session_moves_to_another_device_with_room_before_anything_is_suspended():
    f = measured(fleet({"h0": [sess("a", "h0"), sess("b", "h0")], "h1": []}), h0=1.0)
    got = relief(f)
    assert len(got) == 1 and isinstance(got[0], Move) and (got[0].src, got[0].dst) == ("h0", "h1")


def test_a_c1_session_no_device_can_keep_is_suspended_as_capacity_lost():
    f = measured(fleet({"h0": [sess("a", "h0")]}), h0=1.0)
    assert relief(f) == [Suspend(session_id="a", host_id="h0", reason="capacity_lost")]


def test_hosts_sharing_a_device_are_measured_together_and_a_peer_on_it_is_no_way_out():
    # each host alone is within the limit; the one device they share carries 1.0
    f = shared(measured(fleet({"h0": [sess("a", "h0")], "h1": [sess("b", "h1")]}), h0=0.5, h1=0.5), "h0", "h1")
    got = relief(f)
    assert [(type(a).__name__, a.reason) for a in got] == [("Suspend", "capacity_lost")]


def test_a_device_within_its_limit_is_left_alone_whatever_its_price():
    f = measured(fleet({"h0": [sess("a", "h0"), sess("b", "h0"), sess("c", "h0"), sess("d", "h0")]}), h0=0.85)
    assert relief(f) == []
    assert decide(f, PARAMS, rebalancing=False, scaling=False, offload=False).actions == ()  # off: nothing


def shed_at(sid: str, host_id: str, at: float):
    """A C1 session relief suspended as `capacity_lost` at `at` (the fleet's clock is 1000)."""
    return msgspec.structs.replace(sess(sid, host_id, state="suspended", suspended_at=at, last_input_at=at - 10),
                                   shed="capacity_lost")


def test_a_session_shed_within_the_measurement_window_is_not_counted_again():
    # measured 1.05 with b and c on it (priced 0.4: every share runs 2.6x), a shed half a window ago: the
    # window still holds half of a's blocks (0.2 x 2.6 x 0.5 = 0.26), so the device carries 0.79 and
    # nothing more is shed. Counting them, relief shed b for an excess a had already removed.
    f = measured(fleet({"h0": [sess("b", "h0"), sess("c", "h0"), shed_at("a", "h0", 999.0)]}), h0=1.05)
    assert relief(f) == []
    # a whole window later the measurement is the device's own: 1.05 is past the limit, one more gives way
    f = measured(fleet({"h0": [sess("b", "h0"), sess("c", "h0"), shed_at("a", "h0", 997.0)]}), h0=1.05)
    assert [(a.session_id, a.reason) for a in relief(f)] == [("b", "capacity_lost")]


def test_a_device_within_its_measurement_noise_of_the_limit_is_not_relieved_and_one_past_it_is_relieved_to_it():
    # limit 0.9, margin 0.05: measured 0.94 is noise; 1.2 sheds down to the limit, not to 0.95 (priced 0.4:
    # every 0.2 share runs 3x, 0.6: one shed leaves 0.6)
    f = measured(fleet({"h0": [sess("a", "h0"), sess("b", "h0")]}), h0=0.94)
    assert relief(f) == []
    f = measured(fleet({"h0": [sess("a", "h0"), sess("b", "h0")]}), h0=1.2)
    assert [a.session_id for a in relief(f)] == ["a"]
