"""Contract coherence and the cost arithmetic (libs/contracts.py)."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from libs.contracts import Contract, Demand, Guard, Reservations, check_coherence, demand, estimate, floor_row
from libs.errors import BadRequest
from libs.schemas.common import EngineEntry, ProfileRow
from tests.support.fleet_rows import GIB, c1, host, rows

TIERS = {4, 8, 16}


def rejected_fields(contract: Contract, tiers=TIERS) -> list[str]:
    with pytest.raises(BadRequest) as e:
        check_coherence(contract, "world", tiers)
    assert e.value.reason == "incoherent_contract"
    return e.value.fields["fields"].split(",")


def test_c4_replay_at_t2_is_rejected_naming_class_and_tier():
    bad = Contract(session_class="C4", quality_floor=4, determinism="T2")
    assert rejected_fields(bad) == ["session_class", "determinism"]
    check_coherence(msgspec.structs.replace(bad, determinism="T0"), "world", TIERS)


def test_c1_without_period_is_rejected():
    assert rejected_fields(Contract(session_class="C1", quality_floor=4, determinism="T1")) == [
        "session_class", "period_ms"]


def test_floor_above_best_tier_is_rejected_with_the_best_tier():
    with pytest.raises(BadRequest) as e:
        check_coherence(c1(floor=17), "world", TIERS)
    assert e.value.fields["fields"] == "quality_floor,backend" and e.value.best_tier == 16


def test_unknown_backend_is_rejected_naming_backend():
    assert rejected_fields(c1(), tiers=set()) == ["backend"]


@pytest.mark.parametrize("contract, fields", [
    (Contract(session_class="C2a", quality_floor=4, determinism="T2"), ["session_class", "deadline_ms"]),
    (Contract(session_class="C3", quality_floor=4, determinism="T2", period_ms=10.0), ["session_class", "period_ms"]),
    (Contract(session_class="C5", quality_floor=4, determinism="T2", decode_tier="none", deadline_ms=5.0),
     ["session_class", "deadline_ms"]),
    (Contract(session_class="C3", quality_floor=4, determinism="T2", blocks_per_window=3), ["blocks_per_window"]),
    (c1(decode_tier="none"), ["session_class", "decode_tier"]),
    (Contract(session_class="C5", quality_floor=4, determinism="T2"), ["session_class", "decode_tier"]),
    (c1(deadline_ms=50.0), ["session_class", "deadline_ms"]),
])
def test_each_incoherence_names_its_fields(contract, fields):
    assert rejected_fields(contract) == fields


contracts = st.builds(
    Contract,
    session_class=st.sampled_from(["C1", "C2a", "C2b", "C3", "C4", "C5"]),
    quality_floor=st.integers(1, 32),
    determinism=st.sampled_from(["T0", "T1", "T2"]),
    decode_tier=st.sampled_from(["full", "preview", "none"]),
    period_ms=st.none() | st.floats(0.5, 1e4),
    deadline_ms=st.none() | st.floats(0.5, 1e4),
    blocks_per_window=st.integers(1, 8),
)


@settings(deadline=None)  # timing belongs in benchmarks; the machine is shared
@given(contracts)
def test_coherence_is_exactly_the_documented_rules(c):
    """Accepted iff every rule holds; a rejection always names at least one real field."""
    rules = [
        (c.period_ms is not None) == (c.session_class == "C1"),
        c.deadline_ms is not None or c.session_class not in ("C2a", "C2b"),
        c.deadline_ms is None or c.session_class in ("C2a", "C2b", "C3", "C4"),
        c.blocks_per_window == 1 or c.window_ms is not None,
        c.session_class != "C4" or c.determinism in ("T0", "T1"),
        c.session_class != "C1" or c.decode_tier != "none",
        c.session_class != "C5" or c.decode_tier == "none",
        c.quality_floor <= max(TIERS),
    ]
    try:
        check_coherence(c, "world", TIERS)
    except BadRequest as e:
        assert not all(rules)
        named = e.fields["fields"].split(",")
        assert named and set(named) <= set(Contract.__struct_fields__) | {"backend"}
    else:
        assert all(rules)


@settings(deadline=None)
@given(contracts.filter(lambda c: c.window_ms is not None), st.sampled_from(sorted(TIERS)))
def test_demand_is_blocks_times_every_stage_over_window(c, tier):
    row = next(r for r in rows() if r.tier == tier)
    d = demand(c, row)
    assert d.busy_fraction == pytest.approx(c.blocks_per_window * row.block_ms / c.window_ms)
    assert d.state_bytes == row.state_bytes


def test_windowless_classes_reserve_no_device_share():
    bulk = Contract(session_class="C3", quality_floor=4, determinism="T2")
    assert demand(bulk, rows()[0]) == Demand(busy_fraction=0.0, state_bytes=2 * GIB)


def test_floor_row_takes_the_lowest_profiled_tier_at_or_above_the_floor():
    assert floor_row(rows(), "world", 5).tier == 8
    assert floor_row(rows(), "world", 4).tier == 4
    assert floor_row(rows(), "world", 17) is None
    assert floor_row(rows(), "avatar", 1) is None


def test_estimate_arithmetic_on_one_host():
    # floor 5 → tier 8 (20 ms); period 100 ms → 0.2 of the device; 2 GiB of state.
    guard = Guard(busy_fraction=0.1, memory_fraction=0.05, max_sessions=4)
    pending = [Demand(busy_fraction=0.25, state_bytes=4 * GIB)]
    e = estimate(c1(floor=5), "world", host(busy=0.3, free=40 * GIB, memory=80 * GIB, sessions=2), pending, guard)
    assert (e.tier, e.block_ms, e.busy_fraction, e.state_bytes) == (8, 20.0, pytest.approx(0.2), 2 * GIB)
    assert e.host_busy_fraction == pytest.approx(0.55) and e.busy_limit == pytest.approx(0.9)
    assert e.host_free_bytes == 36 * GIB and e.memory_guard_bytes == 4 * GIB
    assert (e.host_sessions, e.max_sessions, e.fits, e.reason) == (3, 4, True, "")


@pytest.mark.parametrize("kw, reason", [
    ({"busy": 0.71}, "busy"),  # 0.71 + 0.2 > 0.9
    ({"free": 5 * GIB}, "memory"),  # 5 - 2 < 4 (5% of 80)
    ({"sessions": 4}, "slots"),
    ({"profile": rows(backend="avatar")}, "no_profile"),
])
def test_estimate_names_the_first_resource_that_does_not_fit(kw, reason):
    e = estimate(c1(floor=5), "world", host(**kw), [], Guard(max_sessions=4))
    assert not e.fits and e.reason == reason


def test_a_period_shorter_than_one_quantum_never_fits():
    e = estimate(c1(period_ms=5.0), "world", host(), [], Guard(busy_fraction=0.0))
    assert (e.fits, e.reason) == (False, "period")


@settings(deadline=None)
@given(busy=st.floats(0, 1), used=st.floats(0, 0.5), guard=st.floats(0, 0.5))
def test_fits_iff_load_plus_demand_within_the_guard(busy, used, guard):
    e = estimate(c1(), "world", host(busy=busy), [Demand(busy_fraction=used, state_bytes=0)],
                 Guard(busy_fraction=guard))
    assert e.fits == (busy + used + 0.1 <= 1 - guard + 1e-9)


def test_reservations_count_until_a_heartbeat_settle_s_later():
    res = Reservations(settle_s=5.0)
    need = Demand(busy_fraction=0.2, state_bytes=GIB)
    res.add("s1", "h0", need, at=100.0)
    assert res.on(host("h1", at=200.0)) == []
    assert res.on(host("h0", at=104.9)) == [need]
    assert res.on(host("h0", at=105.0)) == [] and res.host_of("s1") is None
    res.add("s2", "h0", need, at=100.0)
    assert res.drop("s2") and not res.drop("s2")


def test_a_reservation_counts_until_the_heartbeat_lists_its_session_however_late():
    """A session that takes long to start (a loaded machine) keeps its room: the host's load does not
    count it before its heartbeat lists it, so neither may time alone end the reservation."""
    res = Reservations(settle_s=30.0)
    need = Demand(busy_fraction=0.2, state_bytes=GIB)
    res.add("s1", "h0", need, at=100.0)
    assert res.on(host("h0", at=120.0)) == [need]  # 20 s later, not listed yet: still counted
    listed = msgspec.structs.replace(host("h0", at=100.5), session_ids=["s1"])
    assert res.on(listed) == [] and res.host_of("s1") is None  # listed: its load counts it now


def test_two_hosts_on_one_device_report_its_capacity_once():
    """Two engine hosts of one machine's CPU split one device: together they carry what one would, not
    twice it; hosts on two devices carry one device's capacity each."""
    from libs.contracts import carried

    row = ProfileRow(backend="world", tier=4, quantum_ms=7.0, block_ms=10.0, state_bytes=1,
                     media_s_per_block=0.1)

    def on(host_id: str, machine: str) -> EngineEntry:
        return msgspec.structs.replace(host(host_id, profile=[row]), machine=machine, device="cpu")

    guard = Guard(busy_fraction=0.1)
    shared = carried(c1(period_ms=100.0), "world", [on("e0", "m1"), on("e1", "m1")], guard)
    assert shared == {"m1/cpu": 9}  # 9 × 0.1 fills 0.9 of the one device
    apart = carried(c1(period_ms=100.0), "world", [on("e0", "m1"), on("e1", "m2")], guard)
    assert apart == {"m1/cpu": 9, "m2/cpu": 9}
