"""The colocation model's α is fitted from a curve (chunk time vs co-located sessions), which is data."""

from __future__ import annotations

import msgspec
import pytest

from bench import fleet, fleet_colocation
from bench.fleet_colocation import Curve, CurveError


def test_the_fit_recovers_the_line_of_a_noisy_curve():
    curve = Curve(source="test", sessions=(1, 2, 3, 4), chunk_ms=(40.1, 59.8, 80.2, 99.9))
    got = fleet_colocation.fit(curve)
    assert got.solo_ms == pytest.approx(40.0, abs=0.3) and got.alpha == pytest.approx(0.5, abs=0.01)
    assert got.rmse_ms < 0.3


def test_without_a_measured_curve_the_profile_models_own_curve_is_fitted():
    """Tier 8 on the simulator's rows: 30, 50, 70, 90 ms for 1-4 sessions: α = 20 / 30."""
    curve, got = fleet.colocation_fit(None)
    assert curve.sessions == (1, 2, 3, 4) and curve.chunk_ms == pytest.approx((30.0, 50.0, 70.0, 90.0))
    assert got.alpha == pytest.approx(2 / 3) and got.rmse_ms == pytest.approx(0.0, abs=1e-9)
    assert fleet.params("colocation", got.alpha).colocation_alpha == pytest.approx(2 / 3)


def test_a_curve_is_read_from_json_and_a_bad_one_is_a_typed_error(tmp_path):
    good = tmp_path / "c.json"
    good.write_bytes(msgspec.json.encode(Curve(source="engine host", sessions=(1, 3), chunk_ms=(10.0, 16.0))))
    assert fleet_colocation.fit(fleet_colocation.load(good)).alpha == pytest.approx(0.3)
    bad = tmp_path / "bad.json"
    bad.write_text('{"source": "x", "sessions": [1], "chunk_ms": "no"}')
    with pytest.raises(CurveError, match="not a co-location curve"):
        fleet_colocation.load(bad)
    with pytest.raises(CurveError, match="at least two"):
        fleet_colocation.fit(Curve(source="x", sessions=(2, 2), chunk_ms=(5.0, 6.0)))


def test_the_engine_hosts_measured_row_is_the_curve_the_latency_model_is_fitted_from():
    """One curve: the points capacity prices k sessions at (`ProfileRow.colocated`, at 1, 2, 4, 8) are
    the ones the simulator's α is fitted from."""
    from libs.schemas.common import ProfileRow

    row = ProfileRow(backend="world", tier=1, quantum_ms=1.0, block_ms=10.0, state_bytes=1, media_s_per_block=0.1,
                     colocated=[10.0, 11.0, 13.0, 17.0])  # 10 × (1 + 0.1 (n − 1))
    curve = fleet_colocation.from_row(row, "test")
    assert curve.sessions == (1, 2, 4, 8) and curve.chunk_ms == (10.0, 11.0, 13.0, 17.0)
    got = fleet_colocation.fit(curve)
    assert got.alpha == pytest.approx(0.1) and got.solo_ms == pytest.approx(10.0)
    with pytest.raises(CurveError):
        fleet_colocation.from_row(msgspec.structs.replace(row, colocated=[10.0]), "test")


@pytest.mark.parametrize(("block_per_quantum", "per_host"), [(1.5, {4: 6, 8: 3, 16: 1}), (2.0, {4: 6, 8: 2, 16: 1})])
def test_the_fitted_colocation_model_reproduces_its_curve_and_the_profile_models_capacity(block_per_quantum, per_host):
    """One device, two models: fitted from the profile model's own curve, the colocation model predicts that
    curve back, and at the cap a host of one class holds as many sessions under either model (6 / 2 / 1 of
    tier 4 / 8 / 16 on the simulator's rows), whatever the rows' block-to-quantum ratio. Until 2026-12-03 its solo chunk was the
    row's `block_ms`, which is the lone chunk only at 1.5 quanta: at 2 (the simulator's rows since issue 23)
    it predicted 20 / 33 / 47 / 60 ms for the 30 / 50 / 70 / 90 ms curve and packed 9 / 4 / 1 (the full
    ServeGen day: the bound at 3,419 GPU-h, statefleet 1.85x its floor)."""
    from bench import fleet_oracle
    from bench.fleet_sim import CONTRACTS, PROFILE, share
    from libs.schemas.common import ProfileRow
    from services.placement.policy import latency as lat

    rows = {r.tier: ProfileRow(backend=r.backend, tier=r.tier, quantum_ms=r.block_ms / block_per_quantum,
                               block_ms=r.block_ms, state_bytes=r.state_bytes, media_s_per_block=0.1)
            for r in PROFILE}
    terms = {t: lat.term(CONTRACTS[t], rows[t], share(t)) for t in rows}
    profile = fleet.params("profile")
    curve = fleet_colocation.profile_curve(profile, terms[8], 8, "world")
    got = fleet_colocation.fit(curve)
    coloc = fleet.params("colocation", got.alpha)
    assert [lat.chunk_ms(coloc, terms[8], 0.0, n) for n in curve.sessions] == pytest.approx(list(curve.chunk_ms))
    for t in terms.values():
        assert lat.chunk_ms(coloc, t, t.share, 1) == pytest.approx(lat.chunk_ms(profile, t, t.share, 1))
        alone = max(n for n in range(1, 17) if lat.chunk_ms(profile, t, n * t.share, n) <= lat.target_ms(profile, t))
        assert lat.sessions_within(coloc, t) == alone
    by_profile = fleet_oracle.caps(profile, terms, fleet.CAP_MS)
    by_coloc = fleet_oracle.caps(coloc, terms, fleet.CAP_MS)
    assert by_profile is not None and by_coloc is not None
    assert {k: c.sessions for k, c in by_coloc.items()} == {
        k: int(c.busy / c.share + 1e-9) for k, c in by_profile.items()} == per_host
