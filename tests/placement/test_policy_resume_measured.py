"""Resumes read the device's measured load (services/placement/policy/overload.py `MeasuredRoom`, used by
offload.resumes in both the simulator and the service): a session shed from a device does not go back while
that device is still measured past its limit, and a C1 shed as `capacity_lost` is re-queued: it resumes as
soon as a device has room, input or not. Decisions only: pure, no clock."""

from __future__ import annotations

import msgspec

from services.placement.policy import Resume, Suspend, decide
from tests.placement.policy_fleet import PARAMS, fleet, measured, sess, shared


def resumes(f):
    d = decide(f, PARAMS, rebalancing=False, scaling=False, offload=True, relieving=True)
    return [a for a in d.actions if isinstance(a, Resume)], [r for r in d.refusals if r.kind == "resume"]


def lost(sid: str, host_id: str, **kw):
    """A C1 session relief suspended as `capacity_lost` (no input since)."""
    return msgspec.structs.replace(sess(sid, host_id, state="suspended", suspended_at=990.0, last_input_at=980.0,
                                        **kw), shed="capacity_lost")


def test_a_capacity_lost_session_is_re_queued_and_resumes_once_its_device_has_room_without_input():
    # its device now measures 0.1: room for its 0.2 share at any scale the device shows
    done, refused = resumes(measured(fleet({"h0": [lost("a", "h0")]}), h0=0.1))
    assert [(r.session_id, r.host_id) for r in done] == [("a", "h0")] and not refused


def test_a_shed_session_does_not_resume_onto_its_device_while_that_is_still_measured_past_its_limit():
    # priced 0.2 (one other session), measured 0.7: the device runs its prices 3.5x, so the shed session's
    # 0.2 share would come back as 0.7 and carry it to 1.4, past the 0.9 limit; the prices alone have room
    f = measured(fleet({"h0": [sess("b", "h0"), lost("a", "h0")]}), h0=0.7)
    done, refused = resumes(f)
    assert not done
    assert [(r.session_id, r.reason) for r in refused] == [("a", "measured_over_limit")]


def test_a_shed_session_whose_input_asks_resumes_onto_another_device_with_measured_room():
    shed = msgspec.structs.replace(sess("a", "h0", state="suspended", suspended_at=990.0, last_input_at=999.0),
                                   shed="overload")
    f = measured(fleet({"h0": [sess("b", "h0"), shed], "h1": []}), h0=0.85, h1=0.0)
    done, _ = resumes(f)
    assert [(r.session_id, r.host_id) for r in done] == [("a", "h1")]


def test_an_overload_shed_session_waits_for_input_as_an_idle_one_does():
    shed = msgspec.structs.replace(sess("a", "h0", state="suspended", suspended_at=990.0, last_input_at=980.0),
                                   shed="overload")
    done, refused = resumes(measured(fleet({"h0": [shed]}), h0=0.0))
    assert not done and not refused


def test_hosts_sharing_a_device_are_measured_together_for_a_resume():
    # h1 is empty and priced idle, but it shares h0's device, measured 0.85: no room there for a 0.2 share
    f = shared(measured(fleet({"h0": [sess("b", "h0"), lost("a", "h0")], "h1": []}), h0=0.85, h1=0.0), "h0", "h1")
    done, refused = resumes(f)
    assert not done and [r.reason for r in refused] == ["measured_over_limit"]


def test_resumes_of_one_decision_share_the_measured_room():
    # 0.5 of measured room on the idle device (scale 1): two 0.2 shares fit, the third would pass the limit
    f = measured(fleet({"h0": [lost("a", "h0"), lost("b", "h0"), lost("c", "h0")]}), h0=0.4)
    done, refused = resumes(f)
    assert sorted(r.session_id for r in done) == ["a", "b"]
    assert [(r.session_id, r.reason) for r in refused] == [("c", "measured_over_limit")]


def test_a_capacity_lost_session_shed_and_resumed_does_not_bounce():
    """Shed at one round, the session's device then measures without it: the next round leaves it suspended."""
    before = measured(fleet({"h0": [sess("a", "h0"), sess("b", "h0")]}), h0=1.0)
    d = decide(before, PARAMS, rebalancing=False, scaling=False, offload=True, relieving=True)
    shed = [a for a in d.actions if isinstance(a, Suspend)]
    assert [a.reason for a in shed] == ["capacity_lost"]
    gone = shed[0].session_id
    # the next heartbeat: the shed session's price and its part of the measured load are gone
    rest = [sess(s, "h0") for s in ("a", "b") if s != gone]
    after = measured(fleet({"h0": [*rest, lost(gone, "h0")]}), h0=0.5)
    done, refused = resumes(after)
    assert not done and [r.session_id for r in refused] == [gone]


def test_a_re_queued_session_no_device_has_room_for_asks_the_autoscaler_for_a_host():
    f = measured(fleet({"h0": [sess("b", "h0"), lost("a", "h0")]}), h0=0.7)
    d = decide(f, PARAMS, rebalancing=False, scaling=True, offload=True, relieving=True)
    assert d.scaling is not None and d.scaling.queued == 1
    assert [type(a).__name__ for a in d.actions] == ["ScaleOut"]


def test_a_session_resumes_on_its_own_process_of_a_shared_device_not_on_a_sibling():
    # h0 and h1 are two processes of one CPU with room; h2 another device. The shed session goes back to h0,
    # never to h1: that would split the device's sessions over two processes, which costs the device more
    f = shared(measured(fleet({"h0": [sess("b", "h0"), lost("a", "h0")], "h1": []}), h0=0.2, h1=0.0), "h0", "h1")
    done, _ = resumes(f)
    assert [(r.session_id, r.host_id) for r in done] == [("a", "h0")]
    # its own process full by its price, a sibling's emptiness is no way back; another device is
    full = shared(measured(fleet({"h0": [sess("b", "h0"), lost("a", "h0")], "h1": [], "h2": []},
                                 background={"h0": 0.75}), h0=0.2, h1=0.0, h2=0.0), "h0", "h1")
    done, _ = resumes(full)
    assert [(r.session_id, r.host_id) for r in done] == [("a", "h2")]


def test_a_capacity_lost_session_goes_back_to_the_device_that_shed_it_only_after_the_hold():
    # shed 2 s ago (the fleet's clock is 1000): its device has room again, another device too
    just = msgspec.structs.replace(lost("a", "h0"), suspended_at=998.0)
    done, _ = resumes(measured(fleet({"h0": [just], "h1": []}), h0=0.1, h1=0.0))
    assert [(r.session_id, r.host_id) for r in done] == [("a", "h1")]  # elsewhere at once
    done, refused = resumes(measured(fleet({"h0": [just]}), h0=0.1))
    assert not done and [r.session_id for r in refused] == ["a"]  # not back onto the device that shed it
    done, _ = resumes(measured(fleet({"h0": [lost("a", "h0")]}), h0=0.1))  # shed 10 s ago: the hold is over
    assert [(r.session_id, r.host_id) for r in done] == [("a", "h0")]
