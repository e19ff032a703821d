"""C1 output pacing (services/engine_host/playout.py): a block is never published before it is ready
nor held past its deadline, and blocks ready within the session's recent readiness go out exactly on
the release grid, so the viewer's period is the contract's."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from services.engine_host.playout import WINDOW, Playout

PERIOD = 0.067


@given(st.lists(st.floats(min_value=0.0, max_value=3 * PERIOD), min_size=1, max_size=200),
       st.floats(min_value=0.0, max_value=1e6))
def test_never_early_never_past_the_deadline(offsets, t0):
    p = Playout(PERIOD)
    for k, o in enumerate(offsets):
        release = t0 + k * PERIOD
        at = p.point(release, release + o)
        assert at >= release + o  # never before it is ready
        assert at <= max(release + o, release + PERIOD) + 1e-9  # an on-time block stays on time


@given(st.lists(st.floats(min_value=0.0, max_value=0.9 * PERIOD), min_size=2, max_size=300))
def test_a_viewer_sees_a_long_period_only_after_a_block_later_than_all_recent_ones(offsets):
    """Jitter a viewer would have seen is absorbed: a published period exceeds the release period only
    at a block ready later than every one of the window's blocks before it."""
    p = Playout(PERIOD)
    points = [p.point(k * PERIOD, k * PERIOD + o) for k, o in enumerate(offsets)]
    for k in range(1, len(offsets)):
        if points[k] - points[k - 1] > PERIOD + 1e-9:
            assert offsets[k] > max(offsets[max(0, k - WINDOW + 1):k])


def test_a_late_block_goes_at_once_and_raises_the_delay_for_the_next():
    p = Playout(PERIOD)
    assert p.point(0.0, 0.010) == 0.010  # the first block sets the delay: 10 ms
    assert p.point(PERIOD, PERIOD + 0.002) == PERIOD + 0.010  # ready early: held to the grid
    assert p.point(2 * PERIOD, 2 * PERIOD + 0.030) == 2 * PERIOD + 0.030  # later than any before: at once
    assert p.point(3 * PERIOD, 3 * PERIOD + 0.001) == 3 * PERIOD + 0.030  # the delay is now 30 ms
    assert p.point(4 * PERIOD, 4 * PERIOD + 0.5) == 4 * PERIOD + 0.5  # past its deadline: never held
    assert p.point(5 * PERIOD, 5 * PERIOD) == 6 * PERIOD  # the delay is capped at the period
