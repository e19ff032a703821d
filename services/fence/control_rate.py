"""How often a session may send a control item (`clear`, `segment_end`): a token bucket per session
and ingress instance. A voice agent clears once per barge-in and ends a segment once per utterance,
a few a second at most; a client that floods them is answered 429 `busy` (retryable) and nothing is
stored, so a flood can neither grow the session's input nor make its engine drop audio again and
again. Per instance, like ingress's other bounds: several instances each allow the rate."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

from libs import errors

MAX_TRACKED = 65536  # sessions whose buckets are kept; the least recently used go first (a full bucket)


class ControlRate:
    def __init__(self, *, per_s: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.per_s, self.burst, self.clock = per_s, burst, clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # session → (tokens, at)

    def take(self, session_id: str, kind: str) -> None:
        """Spend one token of the session's bucket, or raise `Busy` (and spend nothing)."""
        now = self.clock()
        tokens, at = self._buckets.pop(session_id, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - at) * self.per_s)
        if tokens < 1.0:
            self._buckets[session_id] = (tokens, now)
            wait_s = (1.0 - tokens) / self.per_s
            raise errors.Busy(f"too many control items for this session ({self.per_s:g}/s, bursts of "
                              f"{self.burst}); a {kind} was not stored", session_id=session_id, kind=kind,
                              reason="control_rate", retry_after_s=max(1, round(wait_s + 0.5)))
        self._buckets[session_id] = (tokens - 1.0, now)
        while len(self._buckets) > MAX_TRACKED:
            self._buckets.popitem(last=False)

    def forget(self, session_id: str) -> None:
        self._buckets.pop(session_id, None)
