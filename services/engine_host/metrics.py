"""Per-session serving metrics, kept on the host and exported through OpenTelemetry.

first-output latency, control-to-output latency (input accepted → the output of the
block that consumed it), chunk period (between consecutive outputs), real-time factor
(p95 chunk period / media seconds per chunk), per-stage timings, and idle intervals
with the reason the session was not running.
"""

from __future__ import annotations

import math
from collections import defaultdict, deque
from dataclasses import dataclass, field

from libs.schemas.engine import IdleInterval, SessionMetrics, StageTiming
from libs.telemetry import counter, histogram

WINDOW = 512  # samples kept per series
IDLE_KEPT = 64
IDLE_MIN_S = 0.0005  # shorter scheduling gaps are noise, not idleness
SCHEDULING_REASONS = frozenset({"waiting_release", "no_budget", "device_busy"})  # suspends and holds always count

_first_output = histogram("sf_engine_first_output_ms", "Session open to first output published")
_control_to_output = histogram("sf_engine_control_to_output_ms", "Input accepted to the output that consumed it")
_chunk_period = histogram("sf_engine_chunk_period_ms", "Time between consecutive outputs of a session")
_playout_hold = histogram("sf_engine_playout_hold_ms", "Time a C1 block waited for its playout point")
_stage_ms = histogram("sf_engine_stage_ms", "Time of one stage for one unit of work")
_idle_ms = histogram("sf_engine_idle_ms", "A session's idle interval, by reason")
_blocks = counter("sf_engine_blocks_total", "Blocks completed")
_skipped = counter("sf_engine_blocks_skipped_total", "Periodic releases skipped (late or superseded)")


def pct(values, q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1))))]


@dataclass
class SessionStats:
    session_id: str
    backend: str
    media_s_per_block: float
    opened_at: float
    first_output_s: float | None = None
    last_output_at: float | None = None
    blocks: int = 0
    periods: deque = field(default_factory=lambda: deque(maxlen=WINDOW))
    rtf: deque = field(default_factory=lambda: deque(maxlen=WINDOW))  # each period / its block's media seconds
    control: deque = field(default_factory=lambda: deque(maxlen=WINDOW))
    holds: deque = field(default_factory=lambda: deque(maxlen=WINDOW))  # C1 playout holds
    stages: dict[str, deque] = field(default_factory=lambda: defaultdict(lambda: deque(maxlen=WINDOW)))
    idle: deque = field(default_factory=lambda: deque(maxlen=IDLE_KEPT))

    def output(self, now: float, accepted_at: list[float], stage_ms: dict[str, float]) -> None:
        attrs = {"backend": self.backend}
        self.blocks += 1
        _blocks.add(1, attrs)
        if self.first_output_s is None:
            self.first_output_s = now - self.opened_at
            _first_output.record(self.first_output_s * 1000, attrs)
        for t in accepted_at:
            self.control.append(now - t)
            _control_to_output.record((now - t) * 1000, attrs)
        for stage, ms in stage_ms.items():
            self.stages[stage].append(ms)
            _stage_ms.record(ms, {**attrs, "stage": stage})

    def published(self, now: float, media_s: float) -> None:
        """A block's output (`media_s` of media) left for the viewer, after any playout hold: the
        period the viewer sees."""
        if self.last_output_at is not None:
            self.periods.append(now - self.last_output_at)
            self.rtf.append(self.periods[-1] / media_s)
            _chunk_period.record(self.periods[-1] * 1000, {"backend": self.backend})
        self.last_output_at = now

    def held(self, hold_s: float) -> None:
        """How long a C1 block waited for its playout point (0 when it was ready later than it)."""
        self.holds.append(max(0.0, hold_s))
        _playout_hold.record(max(0.0, hold_s) * 1000, {"backend": self.backend})

    def idle_interval(self, start: float, end: float, reason: str) -> None:
        if end - start < IDLE_MIN_S and reason in SCHEDULING_REASONS:
            return
        self.idle.append(IdleInterval(start_s=start, duration_ms=(end - start) * 1000, reason=reason))
        _idle_ms.record((end - start) * 1000, {"backend": self.backend, "reason": reason})

    def skipped(self, n: int) -> None:
        if n:
            _skipped.add(n, {"backend": self.backend})

    def snapshot(self, *, skipped: int, tier: int, tier_changes: int) -> SessionMetrics:
        p95 = pct(self.periods, 95)
        return SessionMetrics(
            session_id=self.session_id, blocks=self.blocks, skipped_blocks=skipped, tier=tier,
            tier_changes=tier_changes,
            first_output_ms=(self.first_output_s or math.nan) * 1000,
            control_to_output_p50_ms=pct(self.control, 50) * 1000,
            control_to_output_p95_ms=pct(self.control, 95) * 1000,
            chunk_period_p50_ms=pct(self.periods, 50) * 1000, chunk_period_p95_ms=p95 * 1000,
            playout_hold_p95_ms=pct(self.holds, 95) * 1000 if self.holds else 0.0,
            media_s_per_block=self.media_s_per_block, rtf_p95=pct(self.rtf, 95),
            stages=[StageTiming(stage=k, count=len(v), mean_ms=sum(v) / len(v), p95_ms=pct(v, 95))
                    for k, v in self.stages.items() if v],
            idle=list(self.idle),
        )
