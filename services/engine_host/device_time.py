"""Device time the host measured itself spending: stage seconds of finished works over wall time.

This is the load the device actually carried, from the stages' own timings (`StageActor` times
each stage's compute), not from the cost model's prices: what admission budgets per session
(`busy_fraction`, at the learned all-stage cost) and what the device ran can then be compared, and
an overload (costs rose while serving, a noisy neighbour) read as it happens.
"""

from __future__ import annotations

from collections import deque

from libs.contracts import MEASURE_WINDOW_S


class DeviceTime:
    """A sliding window of (finished at, stage seconds); `fraction` is their sum over the window."""

    def __init__(self, window_s: float = MEASURE_WINDOW_S) -> None:
        self.window_s = window_s
        self._done: deque[tuple[float, float]] = deque()
        self._sum = 0.0
        self._since: float | None = None  # the first work's finish: a young host's window is shorter

    def add(self, now: float, seconds: float) -> None:
        if self._since is None:
            self._since = now - seconds
        self._done.append((now, seconds))
        self._sum += seconds
        self._expire(now)

    def fraction(self, now: float) -> float:
        """Stage seconds finished within the last window, over the window (the part of it the host ran)."""
        self._expire(now)
        if self._since is None:
            return 0.0
        span = min(self.window_s, max(now - self._since, 1e-3))
        return max(0.0, self._sum) / span

    def _expire(self, now: float) -> None:
        while self._done and self._done[0][0] < now - self.window_s:
            self._sum -= self._done.popleft()[1]
