"""What serving measures of the device, for the capacity record and the heartbeat.

Two things, from every finished dispatch's stage timings: the share of wall time in which a block was
in flight on this host (`busy` — measured, not priced: the union of each dispatch's start-to-decoded
interval), and, per (shape, tier, sessions resident), each block's own time through its stages, which
`capacity_model.observe` turns into the curve's refresh at the concurrency it ran at.
"""

from __future__ import annotations

from collections.abc import Callable

# Observations at a (shape, tier, concurrency) made of fewer blocks than this wait for the next window.
MIN_BLOCKS = 8


class ServingLoad:
    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self._since = clock()
        self._covered = self._since  # the busy union is counted up to here
        self._busy = 0.0
        self._blocks: dict[tuple[str, int, int], tuple[float, int]] = {}  # → (Σ block ms, blocks)

    def ran(self, shape: str, tier: int, sessions: int, start: float, end: float, blocks: int,
            stage_ms: float) -> None:
        """A dispatch of `blocks` blocks ran from `start` to `end` (host clock), its stages taking
        `stage_ms` in all, while `sessions` sessions were resident here."""
        self._busy += max(0.0, end - max(start, self._covered))
        self._covered = max(self._covered, end)
        s, n = self._blocks.get((shape, tier, sessions), (0.0, 0))
        self._blocks[(shape, tier, sessions)] = (s + stage_ms, n + blocks)

    def busy_fraction(self) -> float:
        """The measured in-flight share of wall time since the last `take`."""
        wall = self.clock() - self._since
        return min(1.0, self._busy / wall) if wall > 0 else 0.0

    def take(self) -> tuple[float, list[tuple[str, int, int, float, int]]]:
        """(busy share since the last take, [(shape, tier, sessions, block_ms, blocks)]) and a new window;
        points with too few blocks carry over."""
        busy = self.busy_fraction()
        ready = {k: v for k, v in self._blocks.items() if v[1] >= MIN_BLOCKS}
        self._blocks = {k: v for k, v in self._blocks.items() if k not in ready}
        self._since = self._covered = self.clock()
        self._busy = 0.0
        return busy, [(shape, tier, n, total / blocks, blocks) for (shape, tier, n), (total, blocks) in ready.items()]
