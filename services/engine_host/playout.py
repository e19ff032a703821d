"""Output pacing for interactive (C1) sessions: each block is published at a playout point on the
session's release grid, so the viewer sees the contract's period rather than the host's jitter.

A C1 block released at `r` must be out by its deadline `r + period`. When it is ready varies from
block to block (the device queue, the event loop, a core taken by another process), and a viewer
sees that variation as uneven periods. Like a media player's jitter buffer, but on the sending
side, a block is held until `r + delay`, where `delay` is the latest any of the session's last
`window` blocks was ready, capped at the period: a block ready early waits, one ready later than
all before it goes at once and raises the delay for the next ones. Nothing is held past its
deadline, so pacing never makes an on-time block late; the price is the hold itself, added to
control-to-output latency and reported (`playout_hold_p95_ms`).
"""

from __future__ import annotations

from collections import deque

WINDOW = 32  # blocks whose readiness sets the delay: about two seconds of a 67 ms period


class Playout:
    def __init__(self, period_s: float, window: int = WINDOW) -> None:
        self.period_s = period_s
        self._ready = deque(maxlen=window)  # each recent block's ready time after its release

    def point(self, release: float, ready: float) -> float:
        """When the block released at `release`, ready at `ready`, is published (never before `ready`)."""
        self._ready.append(ready - release)
        return max(ready, release + min(self.period_s, max(self._ready)))
