"""bench.fleet_sweep: its overrides reach both autoscaling arms, and with none it reproduces bench.fleet."""


import msgspec
import pytest

from bench import fleet, fleet_sweep

TINY = {"concurrency": 8, "request_span_s": None, "servegen_span_s": 1200.0, "generated_span_s": 600.0}


def setup(seed: int):
    _, specs, _ = fleet.workload(None, seed, TINY)
    _, _, end = fleet.offered(specs)
    ref = fleet.run_arms(specs, fleet.params("profile"), end, fleet.first_fit_hosts(specs), 1)
    return specs, end, ref


def test_overrides_are_typed_and_checked_against_params():
    assert fleet_sweep.overrides("target_util=0.6,warm_pool_hosts=3,scale_in_cooldown_s=60") == {
        "target_util": 0.6, "warm_pool_hosts": 3, "scale_in_cooldown_s": 60}
    assert fleet_sweep.overrides("") == {}
    for bad in ("target_utl=0.6", "target_util=", "target_util"):
        with pytest.raises(SystemExit):
            fleet_sweep.overrides(bad)


def test_no_override_gives_bench_fleet_numbers_and_an_override_changes_both_arms():
    specs, end, ref = setup(5)
    base = fleet.params("profile")
    same = fleet_sweep.point(specs, base, {}, end, ref["static_peak"])
    for arm in ("statefleet", "turboserve"):
        assert same["arms"][arm]["gpu_hours"] == ref[arm]["gpu_hours"]
        assert same["arms"][arm]["dropped_sessions"] == ref[arm]["dropped_sessions"]
    change = {"cap_fill": 0.95, "cap_scale_in_below": 0.9, "min_hosts": 3}  # min_hosts: TurboServe's too
    hot = fleet_sweep.point(specs, base, change, end, ref["static_peak"])
    assert hot["set"] == change
    for arm in ("statefleet", "turboserve"):
        assert hot["arms"][arm]["gpu_hours"] != same["arms"][arm]["gpu_hours"], arm
    assert hot["gpu_hours_cut_vs_static_peak"] == pytest.approx(
        1 - hot["arms"]["statefleet"]["gpu_hours"] / ref["static_peak"]["gpu_hours"])
    assert msgspec.json.encode(hot)  # the JSON the sweep writes
