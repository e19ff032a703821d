"""The cost model's prices follow the device through the tiers that run (issue 29's frozen floor price)."""

from __future__ import annotations

import pytest

from libs.contracts import MEASURE_WINDOW_S
from services.engine_host.costs import COST_EWMA, HALF_LIFE_S, IDLE_S, STALE_S, CostModel

SHAPE = "avatar:00000000"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def seeded(clock: Clock, half_life_s: float = HALF_LIFE_S) -> CostModel:
    costs = CostModel(clock, half_life_s=half_life_s)
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


def test_a_price_stays_what_was_learned_within_the_window():
    """The window alone (relaxation off: an infinite half-life): a floor measured within `stale_s` of the
    freshest tier keeps its own price."""
    clock = Clock()
    costs = seeded(clock, half_life_s=float("inf"))
    costs.learn(SHAPE, 1, 1, 0.400)
    slow = costs.estimate(SHAPE, 1, 1)
    for _ in range(int(STALE_S / 0.2) - 1):  # tier 8 runs, but the floor was measured within the window
        clock.now += 0.2
        costs.learn(SHAPE, 8, 1, 0.0016)
    assert costs.estimate(SHAPE, 1, 1) == slow


def test_an_idle_price_relaxes_toward_start_up_with_its_half_life():
    """What kept failover's survivors refusing (issue 29, `--hog 2`): a host learned a high price while a
    neighbour loaded the machine, its sessions left, and with no quantum run since, nothing corrected it:
    it refused every stranded session as `period` for the rest of the run. Without a fresh sample the
    learned excess over start-up halves every half-life once it was idle for `IDLE_S`, for admission's price
    and the scheduler's alike."""
    clock = Clock()
    costs = seeded(clock)
    costs.learn(SHAPE, 1, 1, 0.400)
    learned = costs.estimate(SHAPE, 1, 1)
    assert learned == pytest.approx((1 - COST_EWMA) * 0.0004 + COST_EWMA * 0.400)
    assert costs.price(SHAPE, 1, 1) == pytest.approx(0.400)  # admission's: what the window measured
    clock.now += IDLE_S  # no longer than a served session's gaps between quanta: exactly what was learned
    assert costs.estimate(SHAPE, 1, 1) == learned
    clock.now += HALF_LIFE_S  # past the measurement window too: admission's price is the relaxed one
    assert costs.price(SHAPE, 1, 1) == pytest.approx(0.0004 + (learned - 0.0004) / 2)
    clock.now += 9 * HALF_LIFE_S
    assert costs.price(SHAPE, 1, 1) == pytest.approx(0.0004 + (learned - 0.0004) / 2 ** 10)
    assert costs.estimate(SHAPE, 1, 2) == pytest.approx(2 * costs.estimate(SHAPE, 1, 1))
    clock.now += 100 * HALF_LIFE_S
    assert costs.price(SHAPE, 1, 1) == pytest.approx(0.0004)  # back at start-up's measurement
    # a tier derived from the relaxed one relaxes with it (start-up's ratio between the two)
    assert costs.estimate(SHAPE, 8, 1) == pytest.approx(0.0008)


def test_a_price_with_no_start_up_measurement_stays_what_was_learned():
    clock = Clock()
    costs = CostModel(clock)
    costs.learn(SHAPE, 1, 1, 0.400)
    clock.now += 10 * HALF_LIFE_S
    assert costs.estimate(SHAPE, 1, 1) == 0.400


def derived_from_tier_8(costs: CostModel, clock: Clock) -> None:
    clock.now += 2 * STALE_S
    costs.learn(SHAPE, 8, 1, 0.0016)


def relaxed_while_idle(costs: CostModel, clock: Clock) -> None:
    clock.now += IDLE_S + 3 * HALF_LIFE_S


@pytest.mark.parametrize("age", [derived_from_tier_8, relaxed_while_idle])
def test_a_price_no_longer_as_learned_learns_on_from_what_it_became(age):
    """When the floor runs again, its EWMA starts from the derived (or relaxed) price, not from the frozen
    one: a host that is still slow relearns that from its first quanta."""
    clock = Clock()
    costs = seeded(clock)
    costs.learn(SHAPE, 1, 1, 0.400)
    age(costs, clock)
    became = costs.estimate(SHAPE, 1, 1)
    assert became < 0.05
    costs.learn(SHAPE, 1, 1, 0.0010)
    assert costs.estimate(SHAPE, 1, 1) == pytest.approx((1 - COST_EWMA) * became + COST_EWMA * 0.0010)


def test_a_tier_only_start_up_measured_follows_serving_and_with_no_serving_keeps_its_start_up_price():
    clock = Clock()
    costs = seeded(clock)
    assert costs.estimate(SHAPE, 8, 1) == 0.0008
    costs.learn(SHAPE, 1, 1, 0.0012)  # serving at the floor: the device runs 3x slower than at start-up
    floor = costs.estimate(SHAPE, 1, 1)
    assert costs.estimate(SHAPE, 8, 1) == pytest.approx(floor * 0.0008 / 0.0004)


def test_a_busy_host_prices_a_block_at_the_device_time_its_blocks_took_over_the_window_batched_or_not():
    """What the heartbeat prices a block at is what the host's measured load counts: every quantum's stage
    time over every block it ran within the measurement window, so a batch of four counts as four blocks
    and a lone block as one; the scheduler's own price of a batch is kept apart."""
    clock = Clock()
    costs = seeded(clock)
    for _ in range(100):  # a batch of four blocks in 8 ms and a lone block in 4 ms, in turn
        clock.now += 0.01
        costs.learn(SHAPE, 1, 4, 0.008)
        clock.now += 0.01
        costs.learn(SHAPE, 1, 1, 0.004)
    assert costs.price(SHAPE, 1, 1) == pytest.approx(0.012 / 5, rel=1e-3)  # 12 ms over five blocks
    assert costs.price(SHAPE, 8, 1) == pytest.approx(0.012 / 5 * 2, rel=1e-3)  # not served: by start-up's ratio
    assert costs.estimate(SHAPE, 1, 4) == pytest.approx(0.008, rel=1e-3)  # the batch's own price is kept
    clock.now += MEASURE_WINDOW_S + IDLE_S + 20 * HALF_LIFE_S  # nothing served since: back to start-up's
    assert costs.price(SHAPE, 1, 1) == pytest.approx(0.0004, rel=1e-2)
