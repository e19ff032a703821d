"""Admissibility arithmetic for moving live session state (Worldline §4): pure functions, SI units.

Units throughout: bytes, bytes per second, seconds. `gbps(x)` converts gigabits
per second (1e9 bits/s) to bytes per second for callers that speak link rates.

One move of state size S with dirty rate D over a path of bandwidth B, within
horizon H, paying a fixed setup cost X (connection, handshake, commit) and, with
a codec, a payload of r·S plus codec time Y:

- the time the bytes need:      T_migrate = X + Y + r·S / B
- the window left for bytes:    H_eff = H − X − Y
- the live (pre-copy) gate:     B ≥ r·S / H_eff + D       (frozen case: D = 0)
- admissible iff                T_migrate < H  and  the live gate holds
- minimum admissible horizon:   L* = r·S / (B − D) + X + Y   (= S/(B−D) with no setup or codec)
- fleet test on one channel:    C = r·S + D·H_eff,  N ≤ H_eff·B / C

The live gate and the fleet test are computed from the same slack
`H_eff·B − C`, so `n_max ≥ 1` exactly when the live gate holds. In the frozen
case the whole transfer is paid as stall: `stall_s = T_migrate`.

For heterogeneous sessions sharing a channel, `response_times` is the
deadline-monotonic, non-preemptive response-time analysis: a move waits for
the longest lower-priority move already on the wire (blocking) plus every
higher-priority arrival in its window (interference).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

BITS_PER_BYTE = 8


def gbps(gigabits_per_s: float) -> float:
    """Gigabits per second (1e9 bits/s) as bytes per second."""
    return gigabits_per_s * 1e9 / BITS_PER_BYTE


def to_gbps(bytes_per_s: float) -> float:
    return bytes_per_s * BITS_PER_BYTE / 1e9


@dataclass(frozen=True, slots=True)
class Transfer:
    """The state transfer one prospective move would make (named apart from the fleet controller's `Move`
    action and the mover's move). `codec_ratio` is wire bytes over state bytes (1.0: no codec)."""

    state_bytes: float
    dirty_rate_bps: float  # bytes per second the session rewrites while it keeps generating
    horizon_s: float
    bandwidth_bps: float  # bytes per second on the path
    setup_s: float = 0.0
    codec_ratio: float = 1.0
    codec_s: float = 0.0

    def __post_init__(self) -> None:
        for name in ("state_bytes", "dirty_rate_bps", "setup_s", "codec_s"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ("horizon_s", "bandwidth_bps", "codec_ratio"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")

    @property
    def wire_bytes(self) -> float:
        return self.codec_ratio * self.state_bytes

    @property
    def fixed_s(self) -> float:
        return self.setup_s + self.codec_s

    @property
    def window_s(self) -> float:
        """H_eff: the part of the horizon left for bytes once setup and codec are paid."""
        return self.horizon_s - self.fixed_s


@dataclass(frozen=True, slots=True)
class MoveVerdict:
    admissible: bool
    t_migrate_s: float
    frozen_gate_bps: float  # least bandwidth for a stop-and-copy move within the horizon
    live_gate_bps: float  # least bandwidth for a pre-copy move at this dirty rate
    l_star_s: float  # least admissible horizon on this path (inf when D >= B)
    n_max: int  # moves of this kind that share the channel within the horizon
    reason: str  # empty when admissible

    def as_json(self) -> dict:
        return {
            "admissible": self.admissible,
            "t_migrate_ms": self.t_migrate_s * 1e3,
            "frozen_gate_gbps": to_gbps(self.frozen_gate_bps),
            "live_gate_gbps": to_gbps(self.live_gate_bps),
            "l_star_ms": self.l_star_s * 1e3 if math.isfinite(self.l_star_s) else None,
            "n_max": self.n_max,
            "reason": self.reason,
        }


def t_migrate_s(m: Transfer) -> float:
    return m.fixed_s + m.wire_bytes / m.bandwidth_bps


def channel_cost_bytes(m: Transfer) -> float:
    """C = r·S + D·H_eff: the bytes one move puts on the channel within its horizon."""
    return m.wire_bytes + m.dirty_rate_bps * max(m.window_s, 0.0)


def gate_bps(m: Transfer, dirty_rate_bps: float) -> float:
    """Least bandwidth meeting the horizon at this dirty rate (inf when setup eats the horizon)."""
    if m.window_s <= 0:
        return math.inf
    return m.wire_bytes / m.window_s + dirty_rate_bps


def l_star_s(m: Transfer) -> float:
    """L* = r·S / (B − D) + X + Y: the shortest horizon this move can be admitted for."""
    if m.dirty_rate_bps >= m.bandwidth_bps:
        return math.inf
    return m.wire_bytes / (m.bandwidth_bps - m.dirty_rate_bps) + m.fixed_s


def n_max(m: Transfer) -> int:
    """Fleet test: N ≤ H_eff·B / C moves of this kind share one channel within the horizon."""
    if m.window_s <= 0:
        return 0
    capacity = m.window_s * m.bandwidth_bps
    cost = channel_cost_bytes(m)
    if cost == 0:
        return 2**31 - 1  # an empty move costs nothing on the wire; bounded for JSON
    return int(min(capacity // cost, 2**31 - 1))


def live_gate_ok(m: Transfer) -> bool:
    """B ≥ r·S/H_eff + D, as the slack `H_eff·B − C ≥ 0` the fleet test also uses."""
    return m.window_s > 0 and m.window_s * m.bandwidth_bps >= channel_cost_bytes(m)


def evaluate(m: Transfer) -> MoveVerdict:
    t = t_migrate_s(m)
    reason = ""
    if not t < m.horizon_s:
        reason = f"t_migrate {t * 1e3:.3f} ms >= horizon {m.horizon_s * 1e3:.3f} ms"
    elif not live_gate_ok(m):
        reason = (f"bandwidth {to_gbps(m.bandwidth_bps):.4g} Gb/s < live gate "
                  f"{to_gbps(gate_bps(m, m.dirty_rate_bps)):.4g} Gb/s")
    return MoveVerdict(
        admissible=not reason,
        t_migrate_s=t,
        frozen_gate_bps=gate_bps(m, 0.0),
        live_gate_bps=gate_bps(m, m.dirty_rate_bps),
        l_star_s=l_star_s(m),
        n_max=n_max(m),
        reason=reason,
    )


# ---------------------------------------------------------------- heterogeneous sessions


@dataclass(frozen=True, slots=True)
class Flow:
    """One session's move traffic on a shared channel: it may arrive again every `period_s` (default: its horizon)."""

    state_bytes: float
    dirty_rate_bps: float
    horizon_s: float  # relative deadline
    period_s: float | None = None
    codec_ratio: float = 1.0

    def cost_s(self, bandwidth_bps: float, setup_s: float) -> float:
        return setup_s + (self.codec_ratio * self.state_bytes + self.dirty_rate_bps * self.horizon_s) / bandwidth_bps


def response_times(flows: list[Flow], bandwidth_bps: float, *, setup_s: float = 0.0,
                   blocking_s: float = 0.0) -> list[float]:
    """Worst-case response time of each flow (same order as given); inf where it diverges past its horizon.

    Deadline-monotonic priorities, non-preemptive channel: flow i waits for the
    longest lower-priority transfer (or `blocking_s`, a move already running) and
    for every higher-priority arrival before it starts:
    w = B_i + Σ_{j∈hp(i)} (⌊w/T_j⌋ + 1)·C_j,  R_i = w + C_i.
    """
    if bandwidth_bps <= 0:
        raise ValueError("bandwidth_bps must be > 0")
    order = sorted(range(len(flows)), key=lambda i: flows[i].horizon_s)
    costs = [f.cost_s(bandwidth_bps, setup_s) for f in flows]
    out = [math.inf] * len(flows)
    for rank, i in enumerate(order):
        higher, lower = order[:rank], order[rank + 1:]
        blocking = max([blocking_s, *(costs[j] for j in lower)])
        out[i] = _response_time(flows, costs, i, higher, blocking)
    return out


def _response_time(flows: list[Flow], costs: list[float], i: int, higher: list[int], blocking: float) -> float:
    w = blocking + sum(costs[j] for j in higher)
    limit = flows[i].horizon_s
    while w + costs[i] <= limit:
        nxt = blocking + sum((math.floor(w / _period(flows[j])) + 1) * costs[j] for j in higher)
        if nxt == w:
            return w + costs[i]
        w = nxt
    return math.inf


def _period(f: Flow) -> float:
    return f.period_s if f.period_s is not None else f.horizon_s


def schedulable(flows: list[Flow], bandwidth_bps: float, *, setup_s: float = 0.0, blocking_s: float = 0.0) -> bool:
    rts = response_times(flows, bandwidth_bps, setup_s=setup_s, blocking_s=blocking_s)
    return all(r <= f.horizon_s for r, f in zip(rts, flows, strict=True))
