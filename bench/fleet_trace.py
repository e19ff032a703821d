"""Arrivals for the fleet simulator: the shared trace formats (detected by content) or a generator.

Every source yields `Arrival(t_s, size)`: seconds from the first arrival, and a size hint
(prompt tokens) where the format has one. Formats:

- Azure LLM inference CSV: header `TIMESTAMP,ContextTokens,GeneratedTokens`, one row per request.
- Mooncake JSONL: one object per line with `timestamp` (ms), `input_length`, `output_length`.
- ServeGen client windows CSV: header `client_id,window_start_s,rate,cv,iat_dist,iat_shape,iat_scale`;
  per client and 600 s window a fitted inter-arrival law. Arrivals are sampled from it (Gamma or
  Weibull, rescaled to the window's rate, as ServeGen's own generator does), at `rate_scale`
  times the file's relative rates.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np

SERVEGEN_WINDOW_S = 600.0


class TraceError(ValueError):
    """A file that is none of the known formats, or a row that does not parse; names the file and line."""


@dataclass(frozen=True, slots=True)
class Arrival:
    t_s: float
    size: int | None = None


def detect(path: Path) -> str:
    with path.open("r", newline="") as f:
        first = next((line for line in f if line.strip()), "")
    head = first.strip().lstrip("\ufeff")
    if head.startswith("{"):
        try:
            row = json.loads(head)
        except json.JSONDecodeError as e:
            raise TraceError(f"{path}: line 1 is not JSON: {e}") from e
        if "timestamp" in row:
            return "mooncake"
    cols = [c.strip() for c in head.split(",")]
    if cols[:3] == ["TIMESTAMP", "ContextTokens", "GeneratedTokens"]:
        return "azure"
    if cols[:3] == ["client_id", "window_start_s", "rate"]:
        return "servegen"
    raise TraceError(f"{path}: not an Azure CSV, Mooncake JSONL or ServeGen client-windows CSV "
                     f"(first line {head[:80]!r})")


def rows(path: Path) -> tuple[str, list[Arrival] | list[dict]]:
    """(format, arrivals) for request traces, or (format, window rows) for ServeGen."""
    kind = detect(path)
    return kind, {"azure": _azure, "mooncake": _mooncake, "servegen": _servegen_windows}[kind](path)


def _azure(path: Path) -> list[Arrival]:
    out: list[tuple[float, int]] = []
    with path.open(newline="") as f:
        for n, r in enumerate(csv.DictReader(f), 2):
            try:
                ts = _azure_time(r["TIMESTAMP"])
                out.append((ts, int(r["ContextTokens"])))
            except (KeyError, ValueError, TypeError) as e:
                raise TraceError(f"{path}:{n}: bad Azure row: {e}") from e
    return _relative(out)


def _azure_time(text: str) -> float:
    """Seconds since the epoch of an Azure TIMESTAMP: 2023's `YYYY-MM-DD HH:MM:SS.fffffff` and the ISO 8601
    forms other releases use (whole seconds, `T`, a zone offset or `Z`); Python 3.11 parses them all."""
    return datetime.fromisoformat(text.strip()).timestamp()


def _mooncake(path: Path) -> list[Arrival]:
    out: list[tuple[float, int]] = []
    with path.open() as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
                out.append((float(r["timestamp"]) / 1e3, int(r["input_length"])))
            except (KeyError, ValueError, TypeError) as e:
                raise TraceError(f"{path}:{n}: bad Mooncake row: {e}") from e
    return _relative(out)


def _relative(pairs: list[tuple[float, int]]) -> list[Arrival]:
    if not pairs:
        return []
    pairs.sort(key=lambda p: p[0])
    t0 = pairs[0][0]
    return [Arrival(t - t0, size) for t, size in pairs]


def _servegen_windows(path: Path) -> list[dict]:
    out = []
    with path.open(newline="") as f:
        for n, r in enumerate(csv.DictReader(f), 2):
            try:
                out.append({"client": int(r["client_id"]), "start": float(r["window_start_s"]),
                            "rate": float(r["rate"]), "dist": r["iat_dist"].strip(),
                            "shape": float(r["iat_shape"] or 0), "scale": float(r["iat_scale"] or 0)})
            except (KeyError, ValueError, TypeError) as e:
                raise TraceError(f"{path}:{n}: bad ServeGen row: {e}") from e
    return out


def servegen_mean_rate(windows: list[dict], span_s: float | None) -> float:
    """Mean total rate across clients (file units per second) over the windows used."""
    used = [w for w in windows if span_s is None or w["start"] < span_s]
    starts = {w["start"] for w in used}
    return sum(w["rate"] for w in used) / max(len(starts), 1)


def servegen_arrivals(windows: list[dict], rate_scale: float, span_s: float | None,
                      rng: np.random.Generator) -> list[Arrival]:
    """Sample each client's arrivals in each window from its fitted law, scaled to `rate_scale` × its rate."""
    times: list[float] = []
    for w in sorted(windows, key=lambda w: (w["client"], w["start"])):
        if span_s is not None and w["start"] >= span_s:
            continue
        rate = w["rate"] * rate_scale
        if rate <= 0 or w["dist"] not in ("Gamma", "Weibull") or w["shape"] <= 0:
            continue
        times.extend(_window_times(w, rate, rng))
    times.sort()
    t0 = times[0] if times else 0.0
    return [Arrival(t - t0) for t in times]


def _window_times(w: dict, rate: float, rng: np.random.Generator) -> list[float]:
    expected = rate * SERVEGEN_WINDOW_S
    n = max(8, int(expected * 2 + 8))
    if w["dist"] == "Gamma":
        iat = rng.gamma(w["shape"], 1.0, n)
    else:
        iat = rng.weibull(w["shape"], n)
    iat = iat / max(float(iat.mean()), 1e-12) / rate  # rescaled so the window's rate is met
    t = w["start"] + rng.uniform(0.0, 1.0) * iat[0] + np.concatenate(([0.0], np.cumsum(iat[1:])))
    return [float(x) for x in t if x < w["start"] + SERVEGEN_WINDOW_S]


def generated(span_s: float, mean_rate: float, rng: np.random.Generator) -> list[Arrival]:
    """Diurnal swing (one cycle per `span_s`, ±60 %) with burst episodes (×4 for a few minutes)."""
    bursts = []
    t = rng.exponential(span_s / 6)
    while t < span_s:
        bursts.append((t, t + rng.uniform(120, 420)))
        t += rng.exponential(span_s / 6)
    peak = mean_rate * 1.6 * 4
    out, t = [], 0.0
    while True:
        t += rng.exponential(1.0 / peak)  # thinning against the highest rate the shape can reach
        if t >= span_s:
            return out
        rate = mean_rate * (1.0 - 0.6 * math.cos(2 * math.pi * t / span_s))
        if any(a <= t < b for a, b in bursts):
            rate *= 4.0
        if rng.uniform() < rate / peak:
            out.append(Arrival(t, int(rng.lognormal(math.log(2000), 1.0))))


def fixture_text(kind: str) -> str:
    """A tiny valid file of each format, for tests and the docs."""
    return {
        "azure": "TIMESTAMP,ContextTokens,GeneratedTokens\r\n2023-11-16 18:17:03.9799600,4808,10\r\n"
                 "2023-11-16 18:17:05.0319600,3180,8\r\n2023-11-16 18:17:09.5000000,120,3",
        "mooncake": "\n".join(json.dumps({"timestamp": t, "input_length": n, "output_length": 5, "hash_ids": [0]})
                              for t, n in ((0, 6758), (3000, 7322), (5999, 100))) + "\n",
        "servegen": "client_id,window_start_s,rate,cv,iat_dist,iat_shape,iat_scale\n"
                    "0,0,1.5,2.0,Weibull,0.5,0.4\n0,600,0,0,,0,0\n1,0,0.5,1.0,Gamma,1.0,2.0\n"
                    "1,600,0.8,1.2,Gamma,0.7,1.5\n",
    }[kind]

