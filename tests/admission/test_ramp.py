"""Admission takes a device past the concurrency it was measured serving only step by step
(services/admission/ramp.py): pure, no bus, no clock."""

from __future__ import annotations

import msgspec
import pytest

from libs.contracts import Contract, Demand, Guard
from libs.schemas.common import EngineEntry
from services.admission.core import AdmissionCore, Candidate, Policy
from services.admission.ramp import Ramp
from tests.support.admission_core import offer
from tests.support.fleet_rows import c1, host, rows

# tier 4 blocks of 1 ms at a 100 ms period: 0.01 of the device each, so only the ramp limits below
CHEAP = rows(tiers={4: 1.0})


def core(ramp: Ramp | None = None) -> AdmissionCore:
    return AdmissionCore(Policy(guard=Guard(busy_fraction=0.1), queue_capacity=256, queue_timeout_s=10.0,
                                settle_s=5.0, ramp=ramp or Ramp()))


@pytest.mark.parametrize("measured, allowed", [(0, 4), (1, 4), (3, 4), (4, 5), (8, 10), (12, 15), (20, 25)])
def test_the_ramp_allows_its_initial_window_then_a_quarter_more_than_measured(measured, allowed):
    assert Ramp().allowed(measured) == allowed


def test_a_burst_on_a_device_that_measured_nothing_takes_the_initial_window_and_queues_the_rest():
    c = core()
    assert offer(c, [host("h0", profile=CHEAP)], 6) == ["h0"] * 4 + ["queued:ramping"] * 2


def test_the_queue_head_is_placed_once_a_heartbeat_shows_the_device_measured_at_its_size():
    c = core()
    offer(c, [host("h0", profile=CHEAP)], 6)
    placed = [f"s{i}" for i in range(4)]
    listed_unmeasured = host("h0", profile=CHEAP, sessions=4, busy=0.04, session_ids=placed, measured=0)
    assert c.head_ready([listed_unmeasured]) is None  # listed, but no block of theirs was measured yet
    measured = host("h0", profile=CHEAP, sessions=4, busy=0.04, session_ids=placed, measured=4)
    ready = c.head_ready([measured])
    assert ready is not None and ready[0].session_id == "s4"
    c.placed("s4", "h0", Demand(busy_fraction=0.01, state_bytes=1), 1000.0)
    assert c.head_ready([measured]) is None  # 4 measured allow 5: the next waits for the next measurement


def test_the_ramp_never_admits_past_the_capacity_checks():
    # 10 ms blocks: 0.1 each; nine fit the 0.9 limit however much was measured
    c = core(Ramp(initial=64))
    assert offer(c, [host("h0")], 10) == ["h0"] * 9 + ["queued:busy"]


def test_windowless_sessions_take_no_device_share_and_are_not_ramped():
    c3 = Contract(session_class="C3", quality_floor=4, determinism="T0")
    assert offer(core(), [host("h0", profile=CHEAP)], 8, contract=c3) == ["h0"] * 8


def test_a_ramping_session_waits_and_is_never_refused_as_never_fits():
    c = core(Ramp(initial=1))
    assert offer(c, [host("h0", profile=CHEAP)], 3) == ["h0", "queued:ramping", "queued:ramping"]


def test_two_hosts_on_one_device_ramp_the_device_once():
    def on(host_id: str, **kw) -> EngineEntry:
        return msgspec.structs.replace(host(host_id, profile=CHEAP, **kw), machine="m1", device="cpu")

    # the device measured 8 (e0's), so it holds 10 at most however the sessions split over its hosts
    e0 = on("e0", sessions=8, busy=0.08, measured=8)
    assert offer(core(), [e0, on("e1")], 4) == ["e0", "e0", "queued:ramping", "queued:ramping"]
    # a second device measured nothing: its own initial window, not the first device's
    other = msgspec.structs.replace(host("e2", profile=CHEAP), machine="m2", device="cpu")
    assert offer(core(), [e0, on("e1"), other], 7) == ["e0", "e0"] + ["e2"] * 4 + ["queued:ramping"]


def test_placement_is_offered_only_the_hosts_whose_device_the_ramp_lets_grow():
    c = core()
    full = msgspec.structs.replace(host("h0", profile=CHEAP, sessions=4, measured=0), machine="m1")
    fresh = msgspec.structs.replace(host("h1", profile=CHEAP), machine="m2")
    assert c.ramp_hosts(Candidate("x", "world", c1()), [full, fresh]) == ["h1"]
    c3 = Contract(session_class="C3", quality_floor=4, determinism="T0")
    assert c.ramp_hosts(Candidate("y", "world", c3), [full, fresh]) is None
