"""Regression check of the hot paths: the quick benchmarks, compared with the last recorded run.

    python -m bench.regress [--json PATH] [--repeats N] [--only NAME,...] [--record REASON]

Runs the quick form of each hot-path benchmark (gateway, engine, mover, placement, fence race) as a
user runs it (`python -m bench.NAME --quick`), `--repeats` times, interleaved (round 1 runs every
benchmark once, then round 2, ...), so a load that comes and goes hits all of them alike. From each
run it takes a few figures, each a ratio against a baseline measured in that same run where the
benchmark has one, and compares the median of the repeats with the last recorded run in
`bench/baselines.json`. A figure *moved* when the two medians differ by more than the noise this run
measured in its own repeats (the spread, max − min, of its repeats); only those are printed as moved.
A seeded decision count (the fence race's conflicts) is compared exactly: any run that differs.

Not a CI gate: these machines are too noisy for one. Run it (under the bench lock) before a change
to a hot path lands and keep its output with the change. `--record REASON` writes this run as the
new baselines, with the reason, the commit, the date and the load: baselines move only with a
stated reason.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BASELINES = Path(__file__).with_name("baselines.json")
Result = dict[str, Any]


@dataclass(frozen=True)
class Figure:
    name: str  # "<bench>.<figure>"
    better: str  # "higher" | "lower" | "equal" (a decision count: any change is a move)
    take: Callable[[Result], float]
    note: str = ""


def _ratio(num: str, den: str) -> Callable[[Result], float]:
    return lambda r: r[num] / r[den]


FIGURES: dict[str, list[Figure]] = {
    "gateway": [
        Figure("gateway.items_per_s", "higher", lambda r: r["items_per_s"], "absolute; read with the next"),
        Figure("gateway.items_per_cas_append", "higher", _ratio("items_per_s", "cas_appends_per_s"),
               "items/s over a bare JetStream CAS append rate, same run"),
        Figure("gateway.added_ms_p99", "lower", lambda r: r["added_ms_p99"], "e2e p99 less bare pub/sub p99"),
        Figure("gateway.e2e_over_baseline_p50", "lower", _ratio("e2e_ms_p50", "baseline_ms_p50")),
        Figure("gateway.e2e_over_floor_p50", "lower", _ratio("e2e_ms_p50", "floor_ms_p50"),
               "e2e p50 over the store CAS + release CAS + delivery floor, same run"),
    ],
    "engine": [
        Figure("engine.overhead_over_bare", "lower", _ratio("overhead_ms_per_quantum", "bare_forward_ms"),
               "serving overhead per block over the bare forward, same run"),
        Figure("engine.unpublished_overhead_over_bare", "lower",
               _ratio("overhead_unpublished_ms", "bare_forward_ms"), "the same without the output's PNG encoding"),
        Figure("engine.batching_speedup", "higher", lambda r: r["batching_speedup"]),
    ],
    "mover": [
        Figure("mover.shm_over_memcpy", "higher", lambda r: r["shm_over_memcpy"]),
        Figure("mover.verified_over_unverified", "higher", lambda r: r["verified_over_unverified"]),
        Figure("mover.samenode_over_raw_copy", "lower", lambda r: r["samenode_over_raw_copy_paired_median"]),
    ],
    "placement": [
        Figure("placement.decide_1024_over_calibration", "lower",
               lambda r: r["hosts_1024"]["decide_cpu_ms_p50"] / r["calibration_ms"],
               "decide CPU p50 at 1,024 hosts over a fixed pure-Python loop, same process"),
        Figure("placement.decide_ms_p50_1024", "lower", lambda r: r["hosts_1024"]["decide_ms_p50"], "absolute"),
    ],
    "fence_race": [
        Figure("fence_race.full_conflict_runs", "equal", lambda r: r["full"]["conflict_runs"], "must stay 0"),
        Figure("fence_race.id_only_conflict_rate", "equal", lambda r: r["id_only"]["conflict_rate"]),
    ],
}


def run_bench(name: str, out: Path) -> Result:
    """One quick run, in its own process, as a user starts it."""
    cmd = [sys.executable, "-m", f"bench.{name}", "--quick", "--json", str(out)]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout[-2000:]}{proc.stderr[-4000:]}")
    result = json.loads(out.read_text())
    result["_seconds"] = time.monotonic() - t0
    return result


def measure(names: list[str], repeats: int) -> dict[str, list[float]]:
    runs: dict[str, list[float]] = {f.name: [] for n in names for f in FIGURES[n]}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(repeats):
            for name in names:
                print(f"round {r + 1}/{repeats}: bench.{name} --quick", file=sys.stderr, flush=True)
                result = run_bench(name, Path(tmp) / f"{name}-{r}.json")
                for f in FIGURES[name]:
                    runs[f.name].append(float(f.take(result)))
    return runs


def summarize(runs: list[float]) -> dict[str, Any]:
    return {"median": statistics.median(runs), "noise": max(runs) - min(runs), "runs": runs}


def compare(figures: dict[str, dict[str, Any]], baselines: dict[str, Any]) -> list[dict[str, Any]]:
    """Each figure against its baseline: moved when the medians differ by more than this run's noise."""
    better = {f.name: f.better for fs in FIGURES.values() for f in fs}
    rows = []
    for name, now in figures.items():
        base = baselines.get("figures", {}).get(name)
        row = {"figure": name, **now, "baseline": base["median"] if base else None, "verdict": "no baseline"}
        if base is not None:
            delta = now["median"] - base["median"]
            if better[name] == "equal":  # a seeded decision count: any run that differs is a change
                row["verdict"] = "same" if all(x == base["median"] for x in now["runs"]) else "CHANGED"
            elif abs(delta) <= now["noise"]:
                row["verdict"] = "within noise"
            else:
                improved = (delta > 0) == (better[name] == "higher")
                row["verdict"] = "moved: better" if improved else "MOVED: WORSE"
            row["change"] = delta / base["median"] if base["median"] else None
        rows.append(row)
    return rows


def show(rows: list[dict[str, Any]], baselines: dict[str, Any]) -> None:
    rec = baselines.get("recorded", {})
    print(f"baselines: {rec.get('when', '-')} at {rec.get('commit', '-')} ({rec.get('reason', '-')})")
    width = max(len(r["figure"]) for r in rows)
    for r in rows:
        base = "-" if r["baseline"] is None else f"{r['baseline']:.4g}"
        change = f"{100 * r['change']:+.1f}%" if r.get("change") is not None else ""
        print(f"  {r['figure']:<{width}}  {base:>10} -> {r['median']:<10.4g} ±{r['noise']:<9.3g} {change:>8}  "
              f"{r['verdict']}")
    moved = [r for r in rows if r["verdict"] not in ("within noise", "same", "no baseline")]
    print(f"{len(moved)} of {len(rows)} figures moved by more than their noise"
          + (": " + ", ".join(f"{r['figure']} ({r['verdict']})" for r in moved) if moved else ""))


def commit() -> str:
    proc = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          cwd=Path(__file__).parent)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                           text=True, cwd=Path(__file__).parent).stdout.strip()
    return proc.stdout.strip() + ("+changes" if dirty else "") if proc.returncode == 0 else "unknown"


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.regress", description=__doc__.splitlines()[0])
    p.add_argument("--json", type=Path, help="where to write this run's figures and verdicts")
    p.add_argument("--repeats", type=int, default=3, help="runs of each benchmark, interleaved (default 3)")
    p.add_argument("--only", default="", help=f"comma-separated subset of {','.join(FIGURES)}")
    p.add_argument("--record", metavar="REASON", help="write this run to bench/baselines.json, with the reason")
    args = p.parse_args()
    names = [n for n in args.only.split(",") if n] or list(FIGURES)
    unknown = set(names) - set(FIGURES)
    if unknown or args.repeats < 1:
        p.error(f"unknown benchmark(s) {sorted(unknown)}" if unknown else "--repeats must be at least 1")
    baselines = json.loads(BASELINES.read_text()) if BASELINES.exists() else {}
    load_start, started = os.getloadavg(), time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    figures = {name: summarize(runs) for name, runs in measure(names, args.repeats).items()}
    recorded = {"when": started, "commit": commit(), "repeats": args.repeats,
                "load_average": {"start": list(load_start), "end": list(os.getloadavg())}}
    rows = compare(figures, baselines)
    show(rows, baselines)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"run": recorded, "rows": rows, "baselines": baselines.get("recorded")},
                                        indent=2) + "\n")
        print(f"wrote {args.json}")
    if args.record:
        kept = baselines.get("figures", {}) if args.only else {}  # a subset keeps the others' baselines
        BASELINES.write_text(json.dumps({"recorded": {**recorded, "reason": args.record, "benchmarks": names},
                                         "figures": {**kept, **figures}}, indent=2) + "\n")
        print(f"recorded {BASELINES} ({args.record})")


if __name__ == "__main__":
    main()
