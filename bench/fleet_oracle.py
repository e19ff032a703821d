"""A clairvoyant lower bound on GPU-hours at a worst-chunk bound, on the workload the arms replay.

The oracle knows, at every instant, which sessions are alive and which of them have input (it
suspends every idle spell at no cost), boots hosts with no lag and repacks them for free. It
asks only how few hosts can carry the active sessions so that, under the simulator's latency
model, no host's chunk latency exceeds `bound_ms`. No arm can do better at that bound while
serving every session whenever it has input, so its GPU-hours bound every such arm's from below.

Per instant, with n_j active sessions of class j (share s_j of a device):

- Under the profile model a host's chunk latency for class j is `overhead_j + max(busy ×
  window_j, quantum_j)`, so a host carrying a class-j session keeps within the bound only at
  `busy ≤ c_j = (bound − overhead_j) / window_j`, and never above the guard band. Every
  host's load is a sum of shares, so c_j can be rounded down to the lattice of the shares
  (multiples of 0.1 here). A host whose tightest class is t carries load ≤ c_t ≤ c_j for every
  class j on it, so Σ over its sessions of s_j / c_j ≤ load / c_t ≤ 1. Summed over hosts:
  **hosts ≥ Σ_j n_j s_j / c_j**. (A class whose share exceeds c_j needs a host to itself:
  s_j / c_j ≥ 1 counts exactly that. A class that misses the bound even alone makes the bound
  unreachable: infinite hosts.)
- The same argument with session counts: a host holds at most m_j sessions if it carries
  class j (the guard's slot limit, and under the colocation model the n at which
  `solo_j × (1 + α(n − 1))` passes the bound, solo_j the class's chunk alone), so **hosts ≥ Σ_j n_j / m_j**.

The larger of the two, rounded up, bounds the hosts at that instant; integrated over time it
bounds GPU-hours. Beside it, `gpu_hours_packed` is a schedule the same clairvoyant could run
(each class on hosts of its own, ⌊c_j / s_j⌋ per host, memory not modelled), so the truth lies
between the two.

`burst` is not a bound: it sizes the largest wave of arrivals within one boot time, which a
policy that boots hosts on demand and cannot see arrivals coming must meet with hosts already up.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from functools import reduce

from bench.fleet_workload import SessionSpec
from services.placement.policy import Params
from services.placement.policy.latency import Term

_EPS = 1e-9


@dataclass(frozen=True, slots=True)
class Cap:
    share: float
    busy: float  # the most load a host carrying this class may have at the bound
    sessions: int  # the most sessions such a host may hold


def caps(params: Params, terms: dict[int, Term], bound_ms: float) -> dict[int, Cap] | None:
    """Per class, what a host carrying it may hold at the bound; None if some class misses it even alone."""
    unit = _lattice([t.share for t in terms.values()])
    limit = 1.0 - params.guard.busy_fraction
    out = {}
    for k, t in terms.items():
        if not t.window_ms:
            raise ValueError("the oracle models windowed (periodic) classes only")
        n = params.guard.max_sessions
        if params.latency_model == "colocation":
            if bound_ms < t.solo_ms - _EPS:
                return None
            alpha = params.colocation_alpha
            n = min(n, math.floor(1 + (bound_ms / t.solo_ms - 1) / alpha + _EPS) if alpha > 0 else n)
            busy = limit
        else:
            if bound_ms - t.overhead_ms < t.quantum_ms - _EPS:
                return None
            busy = min(limit, (bound_ms - t.overhead_ms) / t.window_ms)
        if unit:
            busy = math.floor(busy / unit + _EPS) * unit
        if t.share > busy + _EPS or n < 1:
            return None
        out[k] = Cap(share=t.share, busy=busy, sessions=n)
    return out


def hosts_lower(counts: dict[int, int], cap: dict[int, Cap]) -> int:
    by_load = sum(n * cap[k].share / cap[k].busy for k, n in counts.items() if n)
    by_count = sum(n / cap[k].sessions for k, n in counts.items() if n)
    return math.ceil(max(by_load, by_count) - _EPS)


def hosts_packed(counts: dict[int, int], cap: dict[int, Cap]) -> int:
    out = 0
    for k, n in counts.items():
        if n:
            c = cap[k]
            out += math.ceil(n / min(c.sessions, math.floor(c.busy / c.share + _EPS)))
    return out


def gpu_hours(specs: list[SessionSpec], params: Params, terms: dict[int, Term], bound_ms: float,
              series: bool = False, until_s: float = math.inf, suspend: bool = True) -> dict:
    """The oracle at `bound_ms`: GPU-hours (lower bound and a packed schedule) and peak hosts, counted
    up to `until_s` (the window the arms are measured over); with `series`, also the bound's hosts over
    time as (t_s, hosts) steps. `suspend=False` keeps every session on a device for its whole life: the
    bound for a policy that cannot offload idle sessions (keep-warm)."""
    cap = caps(params, terms, bound_ms)
    if cap is None:
        return {"bound_ms": bound_ms, "reachable": False, "gpu_hours": math.inf, "gpu_hours_packed": math.inf,
                "peak_hosts": math.inf}
    events: dict[float, dict[int, int]] = {}
    for s in specs:
        t0 = s.arrival_s
        for a, b in (*(s.idle if suspend else ()), (s.arrival_s + s.duration_s, None)):
            _step(events, t0, s.tier, 1)
            _step(events, a, s.tier, -1)
            if b is None:
                break
            t0 = b
    counts = dict.fromkeys(terms, 0)
    lower = packed = 0.0
    peak, last = 0, 0.0  # the window opens at 0: sessions of a warm-up before it count from there
    h_low = h_pack = 0
    steps = []
    for t in sorted(events):
        if t > until_s:
            break
        if t >= 0:
            peak = max(peak, h_low)  # the level the warm-up left at 0
            lower += h_low * (t - last)
            packed += h_pack * (t - last)
        for k, d in events[t].items():
            counts[k] += d
        h_low, h_pack, last = hosts_lower(counts, cap), hosts_packed(counts, cap), max(t, 0.0)
        if t >= 0:
            peak = max(peak, h_low)
        if series:
            if steps and steps[-1][0] == last:  # the warm-up's steps fold into one at 0
                steps.pop()
            steps.append((last, h_low))
    if math.isfinite(until_s) and last < until_s:
        lower += h_low * (until_s - last)
        packed += h_pack * (until_s - last)
    out = {"bound_ms": bound_ms, "reachable": True, "gpu_hours": float(lower) / 3600,
           "gpu_hours_packed": float(packed) / 3600,
           "peak_hosts": peak,
           "per_host": {str(k): {"busy": c.busy, "sessions": c.sessions} for k, c in sorted(cap.items())}}
    return out | {"series": steps} if series else out


def burst(specs: list[SessionSpec], params: Params, terms: dict[int, Term], bound_ms: float, window_s: float) -> dict:
    """The most hosts (by the bound's per-session weights, s_j / c_j) that the sessions arriving within
    any `window_s` need at `bound_ms`: what a policy whose hosts take `window_s` to boot, and which
    cannot see a burst coming, must already hold empty. An estimate of the online price, not a bound."""
    cap = caps(params, terms, bound_ms)
    if cap is None:
        return {"window_s": window_s, "hosts": math.inf, "sessions": 0, "at_s": 0.0}
    arr = sorted((s.arrival_s, cap[s.tier].share / cap[s.tier].busy) for s in specs)
    best = {"window_s": window_s, "hosts": 0.0, "sessions": 0, "at_s": 0.0}
    j, total = 0, 0.0
    for i, (t, w) in enumerate(arr):  # windows that start at an arrival: [t, t + window_s]
        while j < len(arr) and arr[j][0] <= t + window_s:
            total += arr[j][1]
            j += 1
        if total > best["hosts"] + _EPS:
            best = {"window_s": window_s, "hosts": total, "sessions": j - i, "at_s": t}
        total -= w
    return best


def _step(events: dict[float, dict[int, int]], t: float, tier: int, d: int) -> None:
    at = events.setdefault(t, {})
    at[tier] = at.get(tier, 0) + d


def _lattice(shares: list[float]) -> float:
    """The largest u with every share a whole multiple of it (0 when the shares are not rational enough)."""
    fr = [Fraction(s).limit_denominator(10**6) for s in shares if s > 0]
    if not fr or any(abs(float(f) - s) > 1e-12 for f, s in zip(fr, [s for s in shares if s > 0], strict=True)):
        return 0.0
    den = reduce(math.lcm, (f.denominator for f in fr))
    return float(Fraction(reduce(math.gcd, (int(f * den) for f in fr)), den))


def boot_floor(steps: list[tuple[float, int]], boot_s: float, booted: int = 0) -> float:
    """GPU-hours a schedule following `steps` (hosts over time) pays beyond them for booting: each host it
    adds is paid `boot_s` before it serves, unless a host it dropped earlier is kept instead (paid for
    the gap since). Each rise is matched with the latest fall (a stack): what even a policy that knew
    the arrivals one boot ahead would pay on top of the steps. `booted`: hosts already up before the
    first step (booted in a warm-up before the window)."""
    kept: list[float] = []  # times at which a host could have been kept rather than released
    extra, prev = 0.0, booted
    for t, h in steps:
        if h < prev:
            kept.extend([t] * (prev - h))
        for _ in range(max(0, h - prev)):
            extra += min(boot_s, t - kept.pop()) if kept else boot_s
        prev = h
    return float(extra) / 3600
