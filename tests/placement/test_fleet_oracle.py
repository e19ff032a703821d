"""The fleet simulator's clairvoyant bound (bench/fleet_oracle.py): exact on small cases, below every arm, deterministic."""

from __future__ import annotations

import pytest

from bench import fleet, fleet_oracle
from bench.fleet_workload import SessionSpec

TERMS = fleet.oracle_terms()
P = fleet.params("profile")
TINY = {"concurrency": 8, "request_span_s": None, "servegen_span_s": 1200.0, "generated_span_s": 600.0}


def spec(sid: str, tier: int, start: float, length: float, idle: tuple[tuple[float, float], ...] = ()) -> SessionSpec:
    return SessionSpec(session_id=sid, arrival_s=start, duration_s=length, tier=tier, state_bytes=1 << 32,
                       dirty_rate_bps=0.6e9, idle=idle)


def test_at_the_target_a_tier_16_session_needs_a_host_to_itself_and_light_ones_pack():
    # 68.75 ms: tier 16 (20 + 100·busy) may reach 0.4875 busy, i.e. 0.4 on the 0.1 lattice: alone.
    cap = fleet_oracle.caps(P, TERMS, 68.75)
    assert cap is not None and [cap[t].busy for t in (4, 8, 16)] == pytest.approx([0.6, 0.5, 0.4])
    assert fleet_oracle.hosts_lower({4: 0, 8: 0, 16: 3}, cap) == 3
    assert fleet_oracle.hosts_lower({4: 6, 8: 0, 16: 0}, cap) == 1
    assert fleet_oracle.hosts_lower({4: 7, 8: 0, 16: 0}, cap) == 2
    # two tier-8 (0.4) and a tier-4 share a host at 0.5; five tier-8 are bounded by load (1.0 / 0.5 = 2),
    # while two a host packs them on 3: the truth lies between
    assert fleet_oracle.hosts_lower({4: 1, 8: 2, 16: 0}, cap) == 1
    assert (fleet_oracle.hosts_lower({4: 0, 8: 5, 16: 0}, cap), fleet_oracle.hosts_packed({4: 0, 8: 5, 16: 0}, cap)) \
        == (2, 3)
    # at static peak's 110 ms every class may fill to the guard (0.9): two tier-16 share one host
    wide = fleet_oracle.caps(P, TERMS, 110.0)
    assert wide is not None and fleet_oracle.hosts_lower({4: 1, 8: 0, 16: 2}, wide) == 1
    # below a tier-16 chunk alone (60 ms) nobody can meet the bound
    assert fleet_oracle.caps(P, TERMS, 59.0) is None


def test_gpu_hours_integrate_active_sessions_only():
    # two tier-16 sessions overlap for 1800 s; the second idles for 600 s of it (the oracle suspends it)
    specs = [spec("a", 16, 0.0, 3600.0), spec("b", 16, 1800.0, 3600.0, idle=((2400.0, 3000.0),))]
    got = fleet_oracle.gpu_hours(specs, P, TERMS, 68.75)
    # host-seconds: a alone 1800 + both 600 + a alone 600 (b idle) + both 600 + b alone 1800
    assert got["gpu_hours"] == pytest.approx((1800 + 2 * 600 + 600 + 2 * 600 + 1800) / 3600)
    assert got["peak_hosts"] == 2
    assert fleet_oracle.gpu_hours(specs, P, TERMS, 110.0)["gpu_hours"] == pytest.approx(5400 / 3600)  # one host while anyone is active


@pytest.mark.parametrize("seed", [3, 11, 19])
def test_the_bound_is_below_every_arm_that_meets_its_latency_and_drops_nothing(seed):
    """Property over generated workloads: at each arm's own worst chunk (a bound that arm meets), the
    oracle's GPU-hours over the same window are at most the arm's (for arms that serve every session at
    once: no drop, no wait past a tick), and the run gives the same oracle twice."""
    _, specs, _ = fleet.workload(None, seed, TINY)
    _, _, end = fleet.offered(specs)
    res = fleet.run_arms(specs, P, end, fleet.first_fit_hosts(specs), 1)
    assert res["static_peak"]["dropped_sessions"] == 0  # sized by the first-fit replay
    checked = []
    for name, r in res.items():
        if r["dropped_sessions"] or r["stop_and_copy_moves"] or r["queue_wait_max_s"] > fleet.TICK_S:
            continue
        got = fleet_oracle.gpu_hours(specs, P, TERMS, r["worst_chunk_ms"], until_s=end)
        assert got["reachable"] and got["gpu_hours"] <= r["gpu_hours"] + 1e-9, name
        assert got["gpu_hours"] <= got["gpu_hours_packed"] + 1e-9
        checked.append(name)
    assert "static_peak" in checked  # never waits: sized to fit every arrival at once
    assert fleet.oracle(specs, P, res, end) == fleet.oracle(specs, P, res, end)


def test_the_largest_wave_within_a_boot_counts_the_hosts_its_arrivals_need_at_the_bound():
    specs = [spec("a", 16, 0.0, 600.0), spec("b", 16, 30.0, 600.0), spec("c", 4, 50.0, 600.0),
             spec("d", 16, 100.0, 600.0), spec("e", 16, 500.0, 600.0)]
    got = fleet_oracle.burst(specs, P, TERMS, 68.75, 60.0)
    # a, b, c arrive within 60 s: two hosts to themselves plus a sixth of a host for the tier-4
    assert (got["sessions"], got["at_s"]) == (3, 0.0) and got["hosts"] == pytest.approx(2 + 1 / 6)
    assert fleet_oracle.burst(specs, P, TERMS, 110.0, 60.0)["hosts"] == pytest.approx((0.4 + 0.4 + 0.1) / 0.9)


def test_the_window_cuts_the_integral_and_keep_warm_counts_idle_spells():
    specs = [spec("a", 16, 0.0, 3600.0, idle=((600.0, 1200.0),))]
    assert fleet_oracle.gpu_hours(specs, P, TERMS, 68.75, until_s=1800.0)["gpu_hours"] == pytest.approx(1200 / 3600)
    assert fleet_oracle.gpu_hours(specs, P, TERMS, 68.75, until_s=1800.0, suspend=False)["gpu_hours"] == \
        pytest.approx(0.5)


def test_each_host_added_pays_a_boot_unless_one_dropped_lately_is_kept():
    # up to 2 at 0 (two boots), down to 1 at 100, up to 2 at 130 (kept: 30 s), up to 3 at 1000 (a boot)
    steps = [(0.0, 2), (100.0, 1), (130.0, 2), (1000.0, 3)]
    assert fleet_oracle.boot_floor(steps, 60.0) == pytest.approx((60 + 60 + 30 + 60) / 3600)


def test_a_warm_up_session_counts_from_the_window_only_and_its_hosts_need_no_boot():
    # a tier-16 session from -100 s to 300 s and one from 100 s to 200 s: 300 + 100 host-seconds in [0, 300]
    got = fleet_oracle.gpu_hours([spec("w", 16, -100.0, 400.0), spec("a", 16, 100.0, 100.0)], P, TERMS, 68.75,
                                 series=True, until_s=300.0)
    assert got["gpu_hours"] == pytest.approx(400 / 3600) and got["peak_hosts"] == 2
    assert got["series"][0] == (0.0, 1)  # the warm-up's steps fold into one at 0
    assert fleet_oracle.boot_floor(got["series"], 60.0, booted=1) == pytest.approx(60 / 3600)
