"""Autoscaling operating points: statefleet and the TurboServe arm at each setting, on one workload.

`python -m bench.fleet_sweep [--quick] [--trace PATH] [--seed N] --set K=V[,K=V...] [--set ...] --json PATH`

Each `--set` overrides policy parameters (`services.placement.policy.Params` fields) for both
arms (the TurboServe arm reads only the guard, the latency model and `min_hosts` of them; its own
constants are TurboServe's). Static peak, which no autoscaling parameter touches, runs once and
gives the GPU-hours reference. The workload,
simulator and arms are `bench.fleet`'s; this only varies the parameters between runs.
"""

from __future__ import annotations

import sys
from pathlib import Path

import msgspec

from bench import fleet
from bench.common import parser, write
from services.placement.policy import Params

KEYS = ("gpu_hours", "worst_chunk_ms", "p99_chunk_ms", "slo_miss_rate", "over_target_worst_rate", "migrations",
        "stop_and_copy_moves", "dropped_sessions", "queue_wait_p99_s", "start_delay_p99_s", "wall_s")


def overrides(text: str) -> dict[str, float | int]:
    """`target_util=0.6,scale_in_cooldown_s=120` -> typed overrides, checked against Params' fields."""
    fields = {f.name: f.type for f in msgspec.structs.fields(Params)}
    out: dict[str, float | int] = {}
    for item in filter(None, text.split(",")):
        key, _, value = item.partition("=")
        if key not in fields or not value:
            raise SystemExit(f"bench.fleet_sweep: not a numeric Params field setting: {item!r}")
        out[key] = int(value) if value.lstrip("-").isdigit() else float(value)
    return out


def point(specs: list, base: Params, changes: dict, end: float, peak: dict) -> dict:
    p = msgspec.convert(msgspec.structs.asdict(base) | changes, Params, from_attributes=False)
    res = fleet.run_arms(specs, p, end, 0, 0, only=("turboserve", "statefleet"))
    fleet.over_target_worst(res)
    arms = {name: {k: r.get(k) for k in KEYS} for name, r in res.items()}
    sf, turbo = arms["statefleet"], arms["turboserve"]
    cut = 1 - sf["gpu_hours"] / peak["gpu_hours"]
    return {
        "set": changes, "arms": arms, "gpu_hours_cut_vs_static_peak": cut,
        "met": {"worst_within_cap": sf["worst_chunk_ms"] <= fleet.CAP_MS,
                "fewer_gpu_hours_than_turboserve": sf["gpu_hours"] < turbo["gpu_hours"],
                "lower_worst_than_turboserve": sf["worst_chunk_ms"] < turbo["worst_chunk_ms"],
                "no_drops": sf["dropped_sessions"] == 0},
    }


def main() -> None:
    ap = parser("fleet_sweep", __doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--set", action="append", default=[], dest="sets",
                    help="comma-separated Params overrides for one operating point (repeatable; none: the defaults)")
    args = ap.parse_args()
    kind, specs, shape = fleet.workload(args.trace, args.seed, fleet.QUICK if args.quick else fleet.FULL)
    _, _, end = fleet.offered(specs)
    base = fleet.params("profile")
    peak = fleet.run_arms(specs, base, end, fleet.first_fit_hosts(specs), 0, only=("static_peak",))["static_peak"]
    peak.pop("chunk_hist")
    points = []
    for text in args.sets or [""]:
        pt = point(specs, base, overrides(text), end, peak)
        points.append(pt)
        sf, gr = pt["arms"]["statefleet"], pt["arms"]["turboserve"]
        print(f"{kind} seed {args.seed} [{text or 'defaults'}]: statefleet {sf['gpu_hours']:.1f} GPU-h "
              f"(cut {100 * pt['gpu_hours_cut_vs_static_peak']:.1f} %), worst {sf['worst_chunk_ms']:.0f}, "
              f"p99 {sf['p99_chunk_ms']:.0f}, >cap {sf['over_target_worst_rate']:.3f}, drops {sf['dropped_sessions']}"
              f" | turboserve {gr['gpu_hours']:.1f}, worst {gr['worst_chunk_ms']:.0f}, p99 {gr['p99_chunk_ms']:.0f}, "
              f">cap {gr['over_target_worst_rate']:.3f}, drops {gr['dropped_sessions']}", flush=True)
    write(args.json, {"benchmark": "fleet_sweep", "quick": args.quick, "seed": args.seed,
                      "trace": str(args.trace) if args.trace else None, "workload": shape,
                      "static_peak": {k: peak.get(k) for k in KEYS}, "points": points})


if __name__ == "__main__":
    sys.exit(main())
