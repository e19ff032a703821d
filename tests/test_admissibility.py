"""Property tests of the admissibility calculator, and the `statefleet admit-calc` CLI."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from libs import admissibility as adm

sizes = st.floats(min_value=1e3, max_value=1e11)
rates = st.floats(min_value=0, max_value=1e10)
horizons = st.floats(min_value=1e-3, max_value=100)
bandwidths = st.floats(min_value=1e6, max_value=1e11)
setups = st.floats(min_value=0, max_value=0.5)
factors = st.floats(min_value=1.0001, max_value=10)


def move(s, d, h, b, x=0.0, r=1.0, y=0.0) -> adm.Transfer:
    return adm.Transfer(state_bytes=s, dirty_rate_bps=d, horizon_s=h, bandwidth_bps=b, setup_s=x,
                    codec_ratio=r, codec_s=y)


@given(sizes, rates, horizons, bandwidths, setups, factors)
def test_monotone_in_bandwidth_and_horizon(s, d, h, b, x, k):
    base = adm.evaluate(move(s, d, h, b, x))
    faster = adm.evaluate(move(s, d, h, b * k, x))
    longer = adm.evaluate(move(s, d, h * k, b, x))
    assert faster.t_migrate_s <= base.t_migrate_s
    assert faster.n_max >= base.n_max
    assert faster.admissible >= base.admissible
    # The live gate B >= S/H + D only loosens as H grows, dirtying or not.
    assert longer.admissible >= base.admissible
    assert longer.n_max >= base.n_max
    assert longer.l_star_s == pytest.approx(base.l_star_s) or math.isinf(base.l_star_s)


@given(sizes, rates, horizons, bandwidths, setups, factors)
def test_monotone_in_state_and_dirty_rate(s, d, h, b, x, k):
    base = adm.evaluate(move(s, d, h, b, x))
    bigger = adm.evaluate(move(s * k, d, h, b, x))
    dirtier = adm.evaluate(move(s, d * k + 1, h, b, x))
    for worse in (bigger, dirtier):
        assert worse.admissible <= base.admissible
        assert worse.n_max <= base.n_max
        assert worse.l_star_s >= base.l_star_s
        assert worse.live_gate_bps >= base.live_gate_bps
    assert bigger.t_migrate_s >= base.t_migrate_s


@given(sizes, rates, horizons, bandwidths, setups)
def test_gates_agree_with_the_inequalities(s, d, h, b, x):
    m = move(s, d, h, b, x)
    v = adm.evaluate(m)
    t = x + s / b
    assert v.t_migrate_s == pytest.approx(t)
    h_eff = h - x
    # Away from the boundary (floating point), the verdict is the two inequalities.
    if h_eff > 0:
        lhs, rhs = b, s / h_eff + d
        assume(abs(lhs - rhs) > 1e-9 * rhs and abs(t - h) > 1e-9 * h)
        assert v.admissible == (t < h and lhs >= rhs)
        assert v.frozen_gate_bps == pytest.approx(s / h_eff)
        assert v.live_gate_bps == pytest.approx(s / h_eff + d)
    else:
        assert not v.admissible and v.n_max == 0
    if d < b:
        assert v.l_star_s == pytest.approx(s / (b - d) + x)
        # L* is the least admissible horizon: just above it admits, just below does not.
        above = adm.evaluate(move(s, d, v.l_star_s * 1.001 + 1e-9, b, x))
        below = adm.evaluate(move(s, d, v.l_star_s * 0.999, b, x))
        assert above.admissible and not below.admissible
    else:
        assert math.isinf(v.l_star_s) and not v.admissible


@given(sizes, rates, horizons, bandwidths, setups)
def test_n_at_least_one_iff_one_move_fits(s, d, h, b, x):
    m = move(s, d, h, b, x)
    assert (adm.n_max(m) >= 1) == adm.live_gate_ok(m)
    if adm.evaluate(m).admissible:
        assert adm.n_max(m) >= 1


@given(sizes, rates, horizons, bandwidths)
def test_fleet_test_is_h_b_over_c(s, d, h, b):
    m = move(s, d, h, b)
    exact = h * b / (s + d * h)
    assume(abs(exact - round(exact)) > 1e-6)
    assert adm.n_max(m) == min(math.floor(exact), 2**31 - 1)


@given(sizes, rates, horizons, bandwidths, st.integers(1, 12))
def test_response_time_form_reduces_to_the_fleet_test(s, d, h, b, n):
    """n identical sessions on one channel: schedulable under DM exactly when n <= H·B/C."""
    exact = h * b / (s + d * h)
    assume(abs(exact - n) > 1e-6 * n)
    flows = [adm.Flow(state_bytes=s, dirty_rate_bps=d, horizon_s=h)] * n
    assert adm.schedulable(flows, b) == (n <= adm.n_max(move(s, d, h, b)))


def test_response_time_blocking_and_interference():
    b = 1e9
    urgent = adm.Flow(state_bytes=1e8, dirty_rate_bps=0, horizon_s=0.25)  # 0.1 s on the wire
    bulk = adm.Flow(state_bytes=5e8, dirty_rate_bps=0, horizon_s=2.0)  # 0.5 s on the wire
    r_urgent, r_bulk = adm.response_times([urgent, bulk], b)
    # The urgent move can be stuck behind a bulk move already on the wire (non-preemptive).
    assert math.isinf(r_urgent)
    assert r_bulk == pytest.approx(0.6)
    relaxed = adm.Flow(state_bytes=1e8, dirty_rate_bps=0, horizon_s=0.7)
    assert adm.response_times([relaxed, bulk], b) == pytest.approx([0.6, 0.6])
    assert adm.schedulable([relaxed, bulk], b)


def test_codec_variant_pays_codec_time_and_ships_r_s():
    plain = adm.evaluate(move(1e9, 0, 1.0, 1e9))
    coded = adm.evaluate(move(1e9, 0, 1.0, 1e9, r=0.5, y=0.1))
    assert not plain.admissible  # 1 s of bytes in a 1 s horizon
    assert coded.admissible and coded.t_migrate_s == pytest.approx(0.6)
    assert coded.frozen_gate_bps == pytest.approx(0.5e9 / 0.9)


def test_bad_inputs_are_value_errors():
    with pytest.raises(ValueError, match="horizon_s"):
        move(1, 0, 0, 1)
    with pytest.raises(ValueError, match="state_bytes"):
        move(-1, 0, 1, 1)


def test_admit_calc_cli_prints_one_json_object():
    out = subprocess.run(
        [sys.executable, "-m", "statefleet", "admit-calc", "--state-bytes", "1e9", "--dirty-rate", "1e8",
         "--horizon-ms", "1000", "--bandwidth-gbps", "100", "--setup-ms", "5"],
        capture_output=True, text=True, check=True).stdout
    got = json.loads(out)
    assert {"admissible", "t_migrate_ms", "frozen_gate_gbps", "live_gate_gbps", "l_star_ms", "n_max"} <= set(got)
    assert got["admissible"] is True
    assert got["t_migrate_ms"] == pytest.approx(85.0)
    assert got["n_max"] == math.floor(0.995 * 12.5e9 / (1e9 + 1e8 * 0.995))
    bad = subprocess.run(
        [sys.executable, "-m", "statefleet", "admit-calc", "--state-bytes", "1", "--dirty-rate", "0",
         "--horizon-ms", "-5", "--bandwidth-gbps", "1"], capture_output=True, text=True)
    assert bad.returncode == 2 and "horizon_s" in bad.stderr and not bad.stdout
