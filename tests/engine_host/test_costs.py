"""The cost model's prices follow the device through the tiers that run (issue 29's frozen floor price)."""

from __future__ import annotations

import pytest

from services.engine_host.costs import COST_EWMA, STALE_S, CostModel

SHAPE = "avatar:00000000"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def seeded(clock: Clock) -> CostModel:
    costs = CostModel(clock)
    costs.seed(SHAPE, 1, 0.0004)  # start-up: the floor tier 0.4 ms, tier 8 0.8 ms (avatar on this CPU)
    costs.seed(SHAPE, 8, 0.0008)
    return costs


def test_a_floor_price_no_quantum_refreshes_follows_the_tier_that_runs():
    """What failed in the full bench.failover run: one floor quantum ran slow while failed-over sessions
    replayed on a loaded machine, then the session served at tier 8 only; the floor's price (what
    busy_fraction budgets it at) stayed 77 ms while tier 8 ran at 5-7 ms, so the host promised 0.77 of
    the device while it ran 0.05, and every host on that CPU read busy to failover."""
    clock = Clock()
    costs = seeded(clock)
    costs.learn(SHAPE, 1, 1, 0.400)  # one descheduled floor quantum
    slow = (1 - COST_EWMA) * 0.0004 + COST_EWMA * 0.400
    assert costs.estimate(SHAPE, 1, 1) == pytest.approx(slow)  # current: it is the latest measurement
    for _ in range(300):  # a minute at tier 8, the device 2x slower than at start-up
        clock.now += 0.2
        costs.learn(SHAPE, 8, 1, 0.0016)
    tier8 = costs.estimate(SHAPE, 8, 1)
    assert tier8 == pytest.approx(0.0016, rel=1e-3)
    assert costs.estimate(SHAPE, 1, 1) == pytest.approx(tier8 * 0.0004 / 0.0008)  # start-up's ratio, today's speed
    assert costs.estimate(SHAPE, 1, 2) == pytest.approx(2 * tier8 / 2)


def test_a_price_stays_what_was_learned_within_the_window_or_with_nothing_fresher():
    clock = Clock()
    costs = seeded(clock)
    costs.learn(SHAPE, 1, 1, 0.400)
    slow = costs.estimate(SHAPE, 1, 1)
    clock.now += 10 * STALE_S  # nothing of the shape ran since: no evidence the device is faster now
    assert costs.estimate(SHAPE, 1, 1) == slow

    costs = seeded(clock)
    costs.learn(SHAPE, 1, 1, 0.400)
    for _ in range(int(STALE_S / 0.2) - 1):  # tier 8 runs, but the floor was measured within the window
        clock.now += 0.2
        costs.learn(SHAPE, 8, 1, 0.0016)
    assert costs.estimate(SHAPE, 1, 1) == slow


def test_a_stale_price_learns_on_from_what_it_was_derived_as():
    """When the floor runs again, its EWMA starts from the derived price, not from the frozen one."""
    clock = Clock()
    costs = seeded(clock)
    costs.learn(SHAPE, 1, 1, 0.400)
    clock.now += 2 * STALE_S
    costs.learn(SHAPE, 8, 1, 0.0016)
    derived = costs.estimate(SHAPE, 1, 1)
    costs.learn(SHAPE, 1, 1, 0.0010)
    assert costs.estimate(SHAPE, 1, 1) == pytest.approx((1 - COST_EWMA) * derived + COST_EWMA * 0.0010)


def test_a_tier_only_start_up_measured_follows_serving_and_with_no_serving_keeps_its_start_up_price():
    clock = Clock()
    costs = seeded(clock)
    assert costs.estimate(SHAPE, 8, 1) == 0.0008
    costs.learn(SHAPE, 1, 1, 0.0012)  # serving at the floor: the device runs 3x slower than at start-up
    floor = costs.estimate(SHAPE, 1, 1)
    assert costs.estimate(SHAPE, 8, 1) == pytest.approx(floor * 0.0008 / 0.0004)
