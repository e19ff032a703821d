"""How an arrival becomes a session: published figures for length and activity, drawn from the seed.

There is no public trace of long interactive generative sessions (traces/README), so a trace
gives only *when* sessions start (and, where it has one, a size hint). Everything else is drawn
per session from one `numpy` generator seeded by `--seed`, so a seed fixes the workload:

- length: 70 % interactive sessions, log-normal with median 24 min (the 776 desktop-gaming
  sessions' median, Worldline §6), σ = 0.8, at most 2 h; 30 % short clips and capped products,
  log-uniform from 5 s (a clip, TurboServe) to 5 min (the 60 s – 5 min caps of interactive
  world-model products);
- activity: input duty with median 0.86 (Worldline §6), an AFK-heavy bottom decile at 0.05–0.5;
  idle spells exponential with mean 40 s, active spells sized so the duty holds;
- quality floor: the size hint's tercile in the trace picks tier 4 / 8 / 16 (uniform when the
  format has no size); state log-normal around the row's `state_bytes`, dirty rate log-normal
  around 0.6 GB/s (a ring-written KV cache).

Thinning: each arrival starts a session with probability `keep`, chosen so the mean offered
concurrency is about `concurrency` sessions, which keeps the simulated fleet at tens to a few
hundred hosts whatever the trace's absolute rate. Thinning is uniform, so the arrival process's
shape (bursts, swings) is kept.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from bench.fleet_trace import Arrival

GIB = 1 << 30
TIERS = (4, 8, 16)
INTERACTIVE_SHARE = 0.7
INTERACTIVE_MEDIAN_S = 24 * 60.0
INTERACTIVE_SIGMA = 0.8
INTERACTIVE_MAX_S = 2 * 3600.0
CLIP_MIN_S, CLIP_MAX_S = 5.0, 300.0
DUTY_MEDIAN = 0.86
AFK_DECILE = 0.1
IDLE_SPELL_MEAN_S = 40.0
DIRTY_MEDIAN_BPS = 0.6e9
_STD_NORMAL = NormalDist()


@dataclass(frozen=True, slots=True)
class SessionSpec:
    session_id: str
    arrival_s: float
    duration_s: float
    tier: int
    state_bytes: int
    dirty_rate_bps: float
    idle: tuple[tuple[float, float], ...]  # absolute (start, end) spells without input


def mean_duration_s() -> float:
    """The length law's mean, for sizing the thinning."""
    lognormal = INTERACTIVE_MEDIAN_S * math.exp(INTERACTIVE_SIGMA ** 2 / 2)
    clip = (CLIP_MAX_S - CLIP_MIN_S) / math.log(CLIP_MAX_S / CLIP_MIN_S)
    return INTERACTIVE_SHARE * min(lognormal, INTERACTIVE_MAX_S) + (1 - INTERACTIVE_SHARE) * clip


def keep_probability(arrivals: list[Arrival], concurrency: float) -> float:
    span = max(arrivals[-1].t_s - arrivals[0].t_s, 1.0) if arrivals else 1.0
    wanted_rate = concurrency / mean_duration_s()
    return min(1.0, wanted_rate / (len(arrivals) / span)) if arrivals else 0.0


def sessions(arrivals: list[Arrival], keep: float, state_bytes: int, rng: np.random.Generator) -> list[SessionSpec]:
    sizes = sorted(a.size for a in arrivals if a.size is not None)
    cuts = (sizes[len(sizes) // 3], sizes[2 * len(sizes) // 3]) if sizes else None
    out = []
    for i, a in enumerate(arrivals):
        draw = rng.uniform(size=8)  # a fixed number of draws per arrival: thinning never shifts the rest
        if draw[0] >= keep:
            continue
        duration = _duration(draw[1], draw[2])
        tier = _tier(a.size, cuts, draw[3])
        out.append(SessionSpec(
            session_id=f"s{i:07d}", arrival_s=a.t_s, duration_s=duration, tier=tier,
            state_bytes=int(state_bytes * math.exp(0.5 * _normal(draw[4]))),
            dirty_rate_bps=DIRTY_MEDIAN_BPS * math.exp(0.5 * _normal(draw[5])),
            idle=_idle_spells(a.t_s, duration, _duty(draw[6]), np.random.default_rng(int(draw[7] * 2**32)))))
    return out


def _normal(u: float) -> float:
    """A standard normal from one uniform (its inverse CDF)."""
    return _STD_NORMAL.inv_cdf(min(max(u, 1e-12), 1 - 1e-12))


def _duration(u_kind: float, u: float) -> float:
    if u_kind < INTERACTIVE_SHARE:
        return min(INTERACTIVE_MAX_S, INTERACTIVE_MEDIAN_S * math.exp(INTERACTIVE_SIGMA * _normal(u)))
    return CLIP_MIN_S * (CLIP_MAX_S / CLIP_MIN_S) ** u


def _tier(size: int | None, cuts: tuple[int, int] | None, u: float) -> int:
    if size is None or cuts is None:
        return TIERS[min(int(u * 3), 2)]
    return TIERS[0] if size <= cuts[0] else TIERS[1] if size <= cuts[1] else TIERS[2]


def _duty(u: float) -> float:
    if u < AFK_DECILE:
        return 0.05 + 0.45 * u / AFK_DECILE
    return min(0.99, max(0.6, DUTY_MEDIAN + 0.06 * _normal((u - AFK_DECILE) / (1 - AFK_DECILE))))


def _idle_spells(start: float, duration: float, duty: float, rng: np.random.Generator) -> tuple[tuple[float, float], ...]:
    active_mean = IDLE_SPELL_MEAN_S * duty / (1 - duty)
    out, t, end = [], start, start + duration
    while True:
        t += rng.exponential(active_mean)
        if t >= end:
            return tuple(out)
        idle_end = min(end, t + rng.exponential(IDLE_SPELL_MEAN_S))
        out.append((t, idle_end))
        t = idle_end
