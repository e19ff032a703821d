"""What a device carries, from its capacity measured under co-location. Pure: no I/O, no clock.

Sessions on one device slow each other down (CPU threads contend for cores; on a GPU kernels share
SMs and memory bandwidth), so a block's cost depends on how many sessions share the device. The
device's `DeviceCapacity` holds, per (backend, config, tier), the chunk time at 1, 2, 4, … co-located
sessions: the wall time that many blocks take together, over their number. A set of sessions on the
device, n in all, takes

    load = Σ_i blocks_per_window_i · chunk_ms(kind_i, n) / window_ms_i

of the device's time, and the device carries them within their windows iff `load ≤ limit`
(`1 − guard`). Adding a session raises n, so it raises every other session's price too: the number
that fits is read off the curve, never as the single-session cost times n.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import msgspec

from libs.schemas.capacity import Curve, CurvePoint, DeviceCapacity, Kind


def curve_for(cap: DeviceCapacity, backend: str, tier: int) -> Curve | None:
    """The curve of `backend` (its default config: the one admission knows by name) at `tier`."""
    return next((c for c in cap.curves if c.backend == backend and c.tier == tier), None)


def chunk_ms(curve: Curve, sessions: int) -> float:
    """Amortised chunk time at `sessions` co-located sessions: linear between measured points; below
    the first point its value; past the last, the last point's (the host holds no more than its slots)."""
    pts = curve.points
    if not pts:
        return 0.0
    n = max(sessions, 1)
    if n <= pts[0].sessions:
        return pts[0].chunk_ms
    for a, b in zip(pts, pts[1:], strict=False):
        if n <= b.sessions:
            return a.chunk_ms + (b.chunk_ms - a.chunk_ms) * (n - a.sessions) / (b.sessions - a.sessions)
    return pts[-1].chunk_ms


def share(cap: DeviceCapacity, kind: Kind, sessions: int) -> float:
    """One session of `kind`'s share of the device when `sessions` share it (0 without a window)."""
    if kind.window_ms <= 0:
        return 0.0
    curve = curve_for(cap, kind.backend, kind.tier)
    return 0.0 if curve is None else kind.blocks_per_window * chunk_ms(curve, sessions) / kind.window_ms


def count(kinds: Iterable[Kind]) -> int:
    return sum(k.count for k in kinds)


def load(cap: DeviceCapacity, kinds: Sequence[Kind], sessions: int | None = None) -> float:
    """The device share `kinds` take together, priced at `sessions` co-located (default: their number)."""
    n = count(kinds) if sessions is None else sessions
    return sum(k.count * share(cap, k, n) for k in kinds)


def priced(cap: DeviceCapacity, kind: Kind) -> bool:
    """Whether the capacity has a curve for this kind (a kind without a window needs none)."""
    return kind.window_ms <= 0 or curve_for(cap, kind.backend, kind.tier) is not None


def sessions_within(cap: DeviceCapacity, kind: Kind, limit: float, slots: int | None = None) -> int:
    """How many sessions of one kind the device carries within their windows: the most n ≤ slots whose
    load at n stays within `limit`."""
    top = slots or cap.slots or max((p.sessions for c in cap.curves for p in c.points), default=0)
    best = 0
    for n in range(1, top + 1):
        if n * share(cap, kind, n) <= limit + 1e-9:
            best = n
    return best


def merge(kinds: Iterable[Kind]) -> list[Kind]:
    """Equal kinds summed into one entry each (sorted: equal holdings compare equal)."""
    out: dict[tuple[str, int, float, int], int] = {}
    for k in kinds:
        key = (k.backend, k.tier, k.window_ms, k.blocks_per_window)
        out[key] = out.get(key, 0) + k.count
    return [Kind(backend=b, tier=t, window_ms=w, blocks_per_window=n, count=c)
            for (b, t, w, n), c in sorted(out.items()) if c > 0]


# ---------------------------------------------------------------- refreshing a curve from serving

def _at(points: Sequence[CurvePoint], n: int, field: str) -> float:
    return chunk_ms(Curve(backend="", shape="", tier=0, points=[
        CurvePoint(sessions=p.sessions, chunk_ms=getattr(p, field)) for p in points]), n)


def observe(curve: Curve, sessions: int, block_ms: float, blocks: int, *, weight: float = 0.3) -> Curve:
    """`curve` with what serving measured at `sessions` co-located folded in. Serving sees each block's
    own time through its stages (`block_ms`), not the device's throughput, so the start-up chunk time
    at that concurrency is scaled by how much slower blocks run now than they did at start-up (never
    below start-up's), and folded into the point at that concurrency by an EWMA: the curve follows a
    device that slows down (a noisy neighbour, thermal limits) at the concurrency it ran at, and comes
    back when it recovers."""
    base = curve.startup or curve.points
    if not base or blocks <= 0:
        return curve
    start_block = _at(base, sessions, "block_ms")
    slower = max(1.0, block_ms / start_block) if start_block > 0 else 1.0
    target = _at(base, sessions, "chunk_ms") * slower
    pts = {p.sessions: p for p in curve.points}
    old = pts.get(sessions)
    chunk = target if old is None else (1 - weight) * old.chunk_ms + weight * target
    pts[sessions] = CurvePoint(sessions=sessions, chunk_ms=chunk, block_ms=block_ms,
                               blocks=(old.blocks if old else 0) + blocks)
    return msgspec.structs.replace(curve, points=[pts[n] for n in sorted(pts)])


def with_curve(cap: DeviceCapacity, curve: Curve) -> DeviceCapacity:
    """`cap` with `curve` replacing the curve of its (shape, tier), or added."""
    rest = [c for c in cap.curves if (c.shape, c.tier) != (curve.shape, curve.tier)]
    return msgspec.structs.replace(cap, curves=sorted([*rest, curve], key=lambda c: (c.backend, c.shape, c.tier)))


# ---------------------------------------------------------------- the fitted form the simulator takes

class CurveFit(msgspec.Struct, frozen=True, kw_only=True):
    """The curve as `chunk_ms(n) ≈ base_ms · (1 + slope · (n − 1))`, least squares over the measured
    points: the simulator's co-location latency model is fitted from the same points capacity reads."""

    backend: str
    tier: int
    base_ms: float
    slope: float
    points: int


def fit(curve: Curve) -> CurveFit:
    pts = curve.points
    base = pts[0].chunk_ms if pts else 0.0
    xs = [p.sessions - 1 for p in pts]
    ys = [p.chunk_ms / base - 1 if base > 0 else 0.0 for p in pts]
    den = sum(x * x for x in xs)
    slope = sum(x * y for x, y in zip(xs, ys, strict=True)) / den if den else 0.0
    return CurveFit(backend=curve.backend, tier=curve.tier, base_ms=base, slope=slope, points=len(pts))
