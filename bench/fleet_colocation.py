"""The co-location latency model's parameters, fitted from a curve: chunk time against co-located sessions.

The colocation model predicts a chunk at `solo × (1 + α·(n − 1))` for n sessions on one device
(`services.placement.policy.latency`). α is not assumed: it is fitted by least squares from a
`Curve`, a small typed record of measured points (`--colocation-curve PATH`, JSON), so the
curve the engine host measures can be fed in as data. Without one, the curve is the profile
model's own (the chunk of the workload's middle tier as n of them share a device, up to the
guard band): both latency models then describe one device, and capacity and latency come from the
same rows.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import msgspec

from libs.schemas.common import ProfileRow
from services.placement.policy import Params
from services.placement.policy import latency as lat


class CurveError(ValueError):
    """A curve file that does not decode, or whose points cannot be fitted; names the file."""


class Curve(msgspec.Struct, frozen=True, kw_only=True):
    """Chunk time (ms) measured with `sessions[i]` sessions co-located on one device."""

    v: int = 1
    source: str  # where the points come from: a measurement's command and date, or "profile model"
    backend: str = ""
    tier: int = 0
    sessions: tuple[int, ...]
    chunk_ms: tuple[float, ...]


class Fit(NamedTuple):
    solo_ms: float  # the fitted chunk time alone
    alpha: float  # each co-located session adds this fraction of a solo chunk
    rmse_ms: float  # how far the points lie from the fitted line


def fit(curve: Curve) -> Fit:
    """Least squares of `chunk = solo + solo·α·(n − 1)`: a line in n − 1, its slope over its intercept."""
    xs = [n - 1 for n in curve.sessions]
    ys = list(curve.chunk_ms)
    if len(xs) != len(ys) or len(set(xs)) < 2 or min(xs) < 0 or min(ys) <= 0:
        raise CurveError(f"curve from {curve.source!r}: need matching sessions/chunk_ms with at least two distinct "
                         "counts >= 1 and positive times")
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    solo = my - slope * mx
    if solo <= 0:
        raise CurveError(f"curve from {curve.source!r}: the fitted solo chunk time is not positive ({solo:.3f} ms)")
    rmse = (sum((solo + slope * x - y) ** 2 for x, y in zip(xs, ys, strict=True)) / n) ** 0.5
    return Fit(solo_ms=solo, alpha=max(0.0, slope / solo), rmse_ms=rmse)


def load(path: Path) -> Curve:
    try:
        return msgspec.json.decode(path.read_bytes(), type=Curve)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError) as e:
        raise CurveError(f"{path}: not a co-location curve: {e}") from e


def from_row(row: ProfileRow, source: str) -> Curve:
    """The curve an engine host measured at start-up (`ProfileRow.colocated`, point i at 2**i sessions):
    the capacity model's own points, so the simulator's latency and the fleet's capacity read one curve."""
    if len(row.colocated) < 2:
        raise CurveError(f"{row.backend} tier {row.tier}: its row has {len(row.colocated)} co-location points, "
                         "a fit needs two")
    return Curve(source=source, backend=row.backend, tier=row.tier,
                 sessions=tuple(1 << i for i in range(len(row.colocated))), chunk_ms=tuple(row.colocated))


def profile_curve(params: Params, term: lat.Term, tier: int, backend: str) -> Curve:
    """The profile model's own curve for one class: its chunk with n of it on a device, up to the guard."""
    limit = 1.0 - params.guard.busy_fraction
    profile = msgspec.structs.replace(params, latency_model="profile")
    ns = [n for n in range(1, params.guard.max_sessions + 1) if n * term.share <= limit + 1e-9]
    return Curve(source="profile model", backend=backend, tier=tier, sessions=tuple(ns),
                 chunk_ms=tuple(lat.chunk_ms(profile, term, n * term.share, n) for n in ns))
