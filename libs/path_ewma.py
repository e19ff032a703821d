"""Measured path rates: per (source, destination) host pair, the EWMA of completed moves' wire rate.

The mover admits a move on its path's rate and folds each committed move's rate back in; the
placement controller learns the same rates from the mover's receipts and plans moves with them
(`policy.PathRates.pairs`). A path no move has crossed yet has no rate: the caller's prior applies.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class PathEwma:
    alpha: float = 0.3  # weight of the newest observation
    rates: dict[tuple[str, str], float] = field(default_factory=dict)

    def observe(self, source: str, dest: str, wire_bytes: int, seconds: float) -> None:
        """Fold one completed move's measured rate (bytes/s) into its path's EWMA."""
        if wire_bytes <= 0 or seconds <= 0:
            return
        measured = wire_bytes / seconds
        old = self.rates.get((source, dest))
        self.rates[(source, dest)] = measured if old is None else self.alpha * measured + (1 - self.alpha) * old

    def rate(self, source: str, dest: str, prior: float) -> float:
        return self.rates.get((source, dest), prior)

    def pairs(self) -> dict[str, float]:
        """The measured paths keyed "source>dest" (`policy.PathRates.pairs`)."""
        return {f"{s}>{d}": r for (s, d), r in self.rates.items()}
