"""Admission never admits past the capacity a device was measured to have under co-location (pure)."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from libs import capacity_model as cm
from libs.contracts import Guard
from libs.schemas.capacity import Curve, CurvePoint, DeviceCapacity, Kind
from services.admission.core import AdmissionCore, Candidate, Policy
from tests.admission.fleet import c1, host, rows

LIMIT = 1 - Guard().busy_fraction


def capacity(chunks: dict[int, float], tier: int = 4) -> DeviceCapacity:
    """A device whose world blocks at `tier` take chunks[n] ms each, amortised, at n co-located sessions."""
    pts = [CurvePoint(sessions=n, chunk_ms=c, block_ms=c) for n, c in sorted(chunks.items())]
    return DeviceCapacity(device="m/cpu", slots=max(chunks), updated_at=1.0,
                          curves=[Curve(backend="world", shape="world:0", tier=tier, points=pts, startup=pts)])


def on_device(host_id: str, cap: DeviceCapacity, **kw):
    small = rows(state_bytes=1 << 20)  # memory is not what binds here
    return msgspec.structs.replace(host(host_id, profile=small, **kw), machine="m", device="cpu", capacity=cap)


def fill(hosts, contract, *, n_max: int = 200) -> int:
    """Admit one candidate after another (each placed where its verdict says) until one is refused."""
    k = AdmissionCore(Policy(guard=Guard(), queue_capacity=0, queue_timeout_s=1.0, settle_s=60.0))
    for i in range(n_max):
        v = k.submit(Candidate(session_id=f"s{i}", backend="world", contract=contract), hosts, 1000.0)
        if v.outcome != "admitted":
            assert v.outcome == "rejected" and v.reason in ("queue_full", "never_fits")
            return i
        e = v.estimates[0]
        assert e.measured and e.host_busy_fraction + e.busy_fraction <= LIMIT + 1e-9
        k.placed(f"s{i}", e.host_id, e.demand(), 1000.0)
    return n_max


def test_the_session_that_would_cross_the_measured_limit_is_refused():
    # alone a block takes 10 ms (a 100 ms period would fit nine), but co-located sessions slow each other
    cap = capacity({1: 10.0, 2: 12.0, 4: 15.0, 8: 20.0, 16: 30.0})
    kind = Kind(backend="world", tier=4, window_ms=100.0)
    assert cm.sessions_within(cap, kind, LIMIT) == 5  # 5 × 16.25 ms = 81 ms; 6 × 17.5 = 105 > 90
    assert fill([on_device("h0", cap)], c1(100.0)) == 5


def test_two_hosts_on_one_device_carry_the_device_capacity_once():
    cap = capacity({1: 10.0, 2: 12.0, 4: 15.0, 8: 20.0, 16: 30.0})
    alone = fill([on_device("h0", cap)], c1(100.0))
    assert fill([on_device("h0", cap), on_device("h1", cap)], c1(100.0)) == alone
    # sessions a peer already holds are priced at the device's concurrency, as its reservations are
    held = on_device("h1", cap, sessions=3)
    held = msgspec.structs.replace(held, kinds=[Kind(backend="world", tier=4, window_ms=100.0, count=3)])
    assert fill([on_device("h0", cap), held], c1(100.0)) == alone - 3


@settings(deadline=None, max_examples=60)
@given(st.lists(st.floats(1.0, 60.0), min_size=2, max_size=6), st.sampled_from([50.0, 67.0, 100.0, 250.0]))
def test_admitted_load_at_measured_costs_never_passes_the_limit(growth, period):
    chunks, c = {}, 2.0
    for i, g in enumerate(growth):  # a non-decreasing curve, doubling concurrency each point
        c += g / 10
        chunks[2 ** i] = c
    cap = capacity(chunks)
    n = fill([on_device("h0", cap), on_device("h1", cap)], c1(period))
    kinds = [Kind(backend="world", tier=4, window_ms=period, count=n)]
    assert cm.load(cap, kinds) <= LIMIT + 1e-9
    assert n == cm.sessions_within(cap, kinds[0], LIMIT, slots=200)


def test_a_curve_refreshed_from_serving_rises_with_the_slowdown_and_never_below_start_up():
    curve = capacity({1: 10.0, 2: 12.0, 4: 15.0}).curves[0]
    slower = cm.observe(curve, 2, block_ms=24.0, blocks=20)  # blocks at 2 sessions run twice as long now
    assert cm.chunk_ms(slower, 2) > cm.chunk_ms(curve, 2)
    faster = cm.observe(curve, 2, block_ms=6.0, blocks=20)
    assert cm.chunk_ms(faster, 2) == pytest.approx(cm.chunk_ms(curve, 2))


def test_the_fit_the_simulator_takes_comes_from_the_same_points():
    f = cm.fit(capacity({1: 10.0, 2: 12.0, 4: 16.0}).curves[0])
    assert f.base_ms == 10.0 and 0.15 < f.slope < 0.25
