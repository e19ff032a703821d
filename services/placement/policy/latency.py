"""Per-chunk latency predicted from a host's profile rows and what shares its device.

`profile` (default): a block's pipeline stages off the device cost `block_ms − quantum_ms`;
its device quantum is served EDF among the host's sessions, and in the worst case every
quantum due in its window runs first, so the device part takes `busy × window` (the host's
steady-state busy fraction, from `libs.contracts.demand`, times the session's window). Under
`busy ≤ 1` EDF meets every window; above it the formula grows past the window, which is a miss.

`colocation`: the published TurboServe-style form, latency rising with co-located sessions:
`solo_ms × (1 + α·(n − 1))` for n resident sessions, whatever their demand. `solo_ms` is the session's
chunk alone on a host as the profile model predicts it, so the two models agree on a lone session and
differ only in what co-location adds; α is relative, so a curve fitted anywhere (`bench.fleet_colocation`)
carries over. (Until 2026-12-03 it was `block_ms`, equal to the lone chunk only while the rows' block was
1.5 quanta: with the rows of a 2-quantum block the model fitted from the profile curve 30/50/70/90 ms
predicted 20/33/47/60 ms for it, and priced capacity at 9/4/1 tier-4/8/16 sessions instead of 6/2/1.)
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import NamedTuple

from libs.contracts import Contract
from libs.schemas.common import ProfileRow
from services.placement.policy.params import Params

# Windowless classes (bulk, maintenance) run in EDF's slack: their chunk waits for the busy part to pass.
_SLACK_FLOOR = 0.05


class Term(NamedTuple):
    """What one resident session contributes to, and needs from, its host's latency."""

    overhead_ms: float  # block_ms − quantum_ms: the pipeline stages off the device
    quantum_ms: float
    solo_ms: float  # its chunk alone on a host under the profile model: the colocation model's n = 1
    window_ms: float  # 0 for windowless classes
    share: float  # steady-state busy fraction (libs.contracts.demand)


def term(contract: Contract, row: ProfileRow, share: float) -> Term:
    overhead, window = max(row.block_ms - row.quantum_ms, 0.0), contract.window_ms or 0.0
    return Term(overhead_ms=overhead, quantum_ms=row.quantum_ms, solo_ms=_profile_ms(overhead, row.quantum_ms,
                window, share), window_ms=window, share=share)


def _profile_ms(overhead_ms: float, quantum_ms: float, window_ms: float, busy: float) -> float:
    if window_ms:
        return overhead_ms + max(busy * window_ms, quantum_ms)
    return overhead_ms + quantum_ms / max(1.0 - busy, _SLACK_FLOOR)


def chunk_ms(params: Params, t: Term, busy: float, n: int) -> float:
    """Predicted latency of one chunk of the session `t` on a host at `busy` with `n` resident sessions."""
    if params.latency_model == "colocation":
        return t.solo_ms * (1.0 + params.colocation_alpha * max(n - 1, 0))
    return _profile_ms(t.overhead_ms, t.quantum_ms, t.window_ms, busy)


def host_ms(params: Params, kinds: Iterable[Term], busy: float, n: int) -> float:
    """The host's worst predicted chunk latency (0 for an empty host).

    `kinds` are the distinct terms of its `n` resident sessions: each formula depends on a session
    only through its term, so the worst over the kinds is the worst over the sessions.
    """
    if params.latency_model == "profile":
        worst = 0.0
        for t in kinds:  # the hot path of every decision: a plain loop
            w = t.window_ms
            if not w:
                break
            device = busy * w
            v = t.overhead_ms + (device if device > t.quantum_ms else t.quantum_ms)
            if v > worst:
                worst = v
        else:
            return worst
    return max((chunk_ms(params, t, busy, n) for t in kinds), default=0.0)


def target_ms(params: Params, t: Term) -> float:
    """The latency placement aims to keep a chunk of `t` within: the cap less its margin when there is a
    cap, else `latency_target_frac` of its SLO."""
    if params.latency_cap_ms > 0:
        return params.latency_cap_ms - params.cap_margin_ms
    return params.latency_target_frac * slo_ms(t)


def busy_within(params: Params, t: Term) -> float:
    """The largest host busy fraction at which a chunk of `t` stays within the latency target
    (`target_ms`): -inf if never, inf if the model does not bound it by load."""
    if params.latency_model != "profile" or not t.window_ms:
        return math.inf
    room = target_ms(params, t) - t.overhead_ms
    return room / t.window_ms if room >= t.quantum_ms else -math.inf


def sessions_within(params: Params, t: Term) -> int:
    """The most sessions a host carrying `t` may hold with its chunk within the latency target: the
    guard's slots, fewer under the colocation model (where latency grows with the count)."""
    slots = params.guard.max_sessions
    if params.latency_model != "colocation" or params.colocation_alpha <= 0:
        return slots
    n = math.floor(1 + (target_ms(params, t) / t.solo_ms - 1) / params.colocation_alpha + 1e-9)
    return max(1, min(slots, n))


def cap_weight(params: Params, t: Term, lightest: float = 0.0) -> float:
    """The share of a host one session of `t` takes at the latency target: its share over the most load a
    host carrying it may have (the guard band at most), or one of the sessions such a host may hold,
    whichever is larger. 1: it needs a host to itself, as when the room it leaves within the target is
    less than the `lightest` share of the sessions there are (nothing else could join it), or when it
    misses the target even alone."""
    limit = min(1.0 - params.guard.busy_fraction, busy_within(params, t))
    if limit - t.share < lightest - 1e-9:
        return 1.0
    return min(1.0, max(t.share / max(limit, t.share, 1e-9), 1.0 / sessions_within(params, t)))


def joins(params: Params, kinds: Iterable[Term], busy: float, n: int, t: Term) -> bool:
    """A host at `busy` with `n` sessions of `kinds` takes one more of `t` with every chunk on it within the
    latency target and within the guard's load and slots (memory is the capacity check's: `Plan.fit`)."""
    busy, n = busy + t.share, n + 1
    if busy > 1.0 - params.guard.busy_fraction + 1e-9 or n > params.guard.max_sessions:
        return False
    return all(chunk_ms(params, k, busy, n) <= target_ms(params, k) + 1e-9 for k in (t, *kinds))


def slo_ms(t: Term) -> float:
    """The latency a chunk must beat: its window (device part due in one period) plus the off-device stages."""
    return t.overhead_ms + t.window_ms if t.window_ms else float("inf")
