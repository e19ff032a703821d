"""The capacity model reads the measured co-location curve (libs/contracts.py `block_ms_at`, `demand`):
pure, no bus, no clock."""

from __future__ import annotations

import msgspec
import pytest

from libs.contracts import Guard, block_ms_at, carried, demand, device_ms, estimate, pooled
from libs.schemas.common import EngineEntry, ProfileRow
from services.admission.core import AdmissionCore, Policy
from services.admission.ramp import Ramp
from tests.support.admission_core import offer
from tests.support.fleet_rows import c1, host

# Block ms at 1, 2, 4 sessions: 10, 15, 25. k sessions at a 100 ms period take k × block(k) / 100 of the
# device: 0.10, 0.30, 0.60 (k = 3, block 20), 1.00 — the fourth crosses the 0.9 limit.
RISING = ProfileRow(backend="world", tier=4, quantum_ms=7.0, block_ms=10.0, state_bytes=1, media_s_per_block=0.1,
                    colocated=[10.0, 15.0, 25.0])
FLAT = msgspec.structs.replace(RISING, colocated=[10.0, 10.0, 10.0])


def test_the_curve_is_interpolated_between_points_and_extrapolated_from_the_last_two():
    assert [block_ms_at(RISING, k) for k in (1, 2, 3, 4)] == [10.0, 15.0, 20.0, 25.0]
    assert block_ms_at(RISING, 8) == 25.0 + 5.0 * 4  # slope (25 - 15) / 2 per session past 4
    falling = msgspec.structs.replace(RISING, colocated=[10.0, 8.0, 6.0])
    assert block_ms_at(falling, 16) == 6.0  # never cheaper than the last measured point
    lone = msgspec.structs.replace(RISING, colocated=[])
    assert block_ms_at(lone, 7) == lone.block_ms and device_ms(lone, 3) == 30.0  # no curve: today's cost


def test_demand_is_the_marginal_device_time_of_one_more_session():
    shares = [demand(c1(), RISING, k).busy_fraction for k in range(4)]
    assert shares == pytest.approx([0.1, 0.2, 0.3, 0.4])  # sums to device_ms(k) / period
    assert sum(shares[:3]) == pytest.approx(device_ms(RISING, 3) / 100.0)
    assert demand(c1(), FLAT, 5).busy_fraction == pytest.approx(0.1)


def admitted(row: ProfileRow, offered: int) -> list[str]:
    """Offer `offered` sessions one by one to a pure admission core over one empty host (the curve alone
    decides: no ramp below the offer; tests/admission/test_ramp.py has the ramp)."""
    core = AdmissionCore(Policy(guard=Guard(busy_fraction=0.1), queue_capacity=64, queue_timeout_s=10.0,
                                settle_s=5.0, ramp=Ramp(initial=offered)))
    return ["admitted" if r == "h0" else r for r in offer(core, [host("h0", profile=[row])], offered)]


def test_admission_refuses_the_session_that_would_cross_the_measured_limit():
    assert admitted(RISING, 5) == ["admitted"] * 3 + ["queued:busy"] * 2


def test_admission_accepts_it_with_a_flat_curve():
    assert admitted(FLAT, 10) == ["admitted"] * 9 + ["queued:busy"]


def test_the_heartbeats_session_count_is_the_k_a_candidate_is_priced_at():
    # a heartbeat with 3 sessions measured at 0.6: the 4th would add 0.4 and cross 0.9
    e = estimate(c1(), "world", host(busy=0.6, sessions=3, profile=[RISING]), [], Guard(busy_fraction=0.1))
    assert (e.fits, e.reason, e.device_sessions, e.busy_fraction) == (False, "busy", 3, pytest.approx(0.4))
    e = estimate(c1(), "world", host(busy=0.3, sessions=3, profile=[FLAT]), [], Guard(busy_fraction=0.1))
    assert e.fits and e.busy_fraction == pytest.approx(0.1)


def on(host_id: str, machine: str, sessions: int = 0, busy: float = 0.0) -> EngineEntry:
    return msgspec.structs.replace(host(host_id, profile=[RISING], sessions=sessions, busy=busy),
                                   machine=machine, device="cpu")


def test_two_hosts_on_one_device_sharing_rows_yield_the_devices_capacity_once():
    guard = Guard(busy_fraction=0.1)
    assert carried(c1(), "world", [on("e0", "m1"), on("e1", "m1")], guard) == {"m1/cpu": 3}
    assert carried(c1(), "world", [on("e0", "m1"), on("e1", "m2")], guard) == {"m1/cpu": 3, "m2/cpu": 3}
    # a host's peer's sessions are the device's: e1, empty itself, prices its first at k = 2
    views = pooled([on("e0", "m1", sessions=2, busy=0.3), on("e1", "m1")], lambda h: [])
    e = estimate(c1(), "world", views["e1"], [], guard)
    assert (e.device_sessions, e.busy_fraction, e.host_busy_fraction) == (2, pytest.approx(0.3), pytest.approx(0.3))


def test_the_hosts_of_one_device_price_it_at_the_dearest_cost_any_of_them_learned():
    # e0 serves the device's sessions and learned its block at twice start-up's; e1, idle, still carries
    # start-up's rows. Read from e1's rows the device would take its next session at half its cost
    dear = msgspec.structs.replace(RISING, block_ms=20.0, quantum_ms=14.0, colocated=[20.0, 30.0, 50.0])
    e0 = msgspec.structs.replace(on("e0", "m1", sessions=1, busy=0.2), profile=[dear])
    e1 = on("e1", "m1")
    views = pooled([e0, e1], lambda h: [])
    assert views["e1"].profile == views["e0"].profile == [dear]
    guard = Guard(busy_fraction=0.1)
    assert estimate(c1(), "world", views["e1"], [], guard).busy_fraction == \
        estimate(c1(), "world", views["e0"], [], guard).busy_fraction == pytest.approx(0.4)  # 2 × 30 − 20, per 100 ms
    # a host alone on its device keeps its own rows
    assert pooled([e1], lambda h: [])["e1"].profile == [RISING]
