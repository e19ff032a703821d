"""Fleet simulator: six provisioning arms on one workload, driven by the placement service's own policy functions.

`python -m bench.fleet [--quick] [--trace PATH] [--seed N] --json PATH`

Sessions start when the trace's requests arrive (any format in /work/shared/traces, detected by
content; without `--trace`, a generated day of diurnal swings and bursts) and take their length,
activity and size from published figures, drawn from the seed (`bench/fleet_workload.py`).
Every arm replays the same sessions in the same discrete-event model (`bench/fleet_sim.py`);
the arms are in `bench/fleet_arms.py`. Numbers are simulated, not measured on hardware: the
latency model is calibrated on profile rows (inputs stated in the JSON), so they compare
policies, not machines. `docs/fleet.md` explains the model and carries the latest numbers.

Every figure is computed over the arrival window (first to last arrival): no drain-down tail after
the last arrival decides a result. Chunks are held to one absolute latency cap, `CAP_MS`, and
statefleet's GPU-hours are compared with the clairvoyant bound at that same cap.
"""

from __future__ import annotations

import dataclasses
import math
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import msgspec
import numpy as np

from bench import fleet_arms as arms
from bench import fleet_colocation, fleet_oracle, fleet_trace, fleet_turboserve, fleet_workload
from bench.common import parser, table, write
from bench.fleet_sim import (
    BACKEND,
    CONTRACTS,
    GUARD,
    HOST_MEMORY,
    PERIOD_MS,
    PROFILE,
    PROVISION_S,
    RESUME_BPS,
    ROW,
    Sim,
    share,
    share_over,
)
from services.placement.policy import Params
from services.placement.policy import latency as lat

# The latency cap B: 37.5 % below the 110 ms a host filled to the guard band gives, as an absolute limit on
# every chunk (move and resume cut-overs included).
CAP_MS = 68.75
BOUND_RATIO = 1.35  # statefleet's GPU-hours at most this many times the clairvoyant bound at the cap
# against static peak: context only (keys kept from the earlier issue)
TARGETS = {"gpu_hours_cut_vs_static_peak": 0.372, "worst_chunk_cut_vs_static_peak": 0.375}
QUICK = {"concurrency": 150, "request_span_s": 1800.0, "servegen_span_s": 5400.0, "generated_span_s": 5400.0}
FULL = {"concurrency": 600, "request_span_s": None, "servegen_span_s": 86400.0, "generated_span_s": 12 * 3600.0}
TICK_S = 5.0
# The service is already running when the window opens: the trace's first WARMUP_S of arrivals, drawn afresh,
# are replayed just before it (at t − WARMUP_S), so every arm enters the window with live sessions and an
# arrival memory (`fleet_sim.ARRIVAL_MEMORY_S`) as a service in production would, not cold with
# `min_hosts + warm_pool_hosts` hosts against a production rate. Nothing before 0 is counted.
WARMUP_S = 600.0


def params(model: str, alpha: float | None = None) -> Params:
    """The policy's knobs for a run: the defaults, the simulator's guard, the latency model (with its
    fitted α under colocation) and the cap every arm is measured against."""
    p = Params(guard=GUARD, latency_model=model, latency_cap_ms=CAP_MS)
    return msgspec.structs.replace(p, colocation_alpha=alpha) if alpha is not None else p


def colocation_fit(path: Path | None) -> tuple[fleet_colocation.Curve, fleet_colocation.Fit]:
    """The colocation model's curve (a measured one from `path`, else the profile model's own for tier 8)."""
    curve = fleet_colocation.load(path) if path is not None else fleet_colocation.profile_curve(
        Params(guard=GUARD), oracle_terms()[8], 8, BACKEND)
    return curve, fleet_colocation.fit(curve)


def workload(trace: Path | None, seed: int, size: dict) -> tuple[str, list[fleet_workload.SessionSpec], dict]:
    rng = np.random.default_rng(seed)
    if trace is None:
        span = size["generated_span_s"]
        arrivals = fleet_trace.generated(span, size["concurrency"] / fleet_workload.mean_duration_s(), rng)
        kind = "generated"
    else:
        kind, got = fleet_trace.rows(trace)
        if kind == "servegen":
            span = size["servegen_span_s"]
            wanted = size["concurrency"] / fleet_workload.mean_duration_s()
            arrivals = fleet_trace.servegen_arrivals(got, wanted / fleet_trace.servegen_mean_rate(got, span), span, rng)
        else:
            span = size["request_span_s"]
            arrivals = [a for a in got if span is None or a.t_s <= span]
    keep = fleet_workload.keep_probability(arrivals, size["concurrency"]) if kind in ("azure", "mooncake") else 1.0
    specs = fleet_workload.sessions(arrivals, keep, ROW[8].state_bytes, rng)
    warm = warmup(arrivals, keep, rng)
    return kind, warm + specs, {"format": kind, "arrivals": len(arrivals), "keep_probability": keep,
                                "sessions": len(specs), "warmup_s": WARMUP_S, "warmup_sessions": len(warm)}


def warmup(arrivals: list[fleet_trace.Arrival], keep: float, rng: np.random.Generator) -> list[fleet_workload.SessionSpec]:
    """The sessions of the warm-up before the window: the first `WARMUP_S` of arrivals shifted to before 0,
    each drawn afresh from the same generator after the window's own (which they do not change)."""
    early = [fleet_trace.Arrival(a.t_s - WARMUP_S, a.size) for a in arrivals if a.t_s < WARMUP_S]
    return [dataclasses.replace(s, session_id="w" + s.session_id[1:])
            for s in fleet_workload.sessions(early, keep, ROW[8].state_bytes, rng)]


def offered(specs: list[fleet_workload.SessionSpec]) -> tuple[float, float, float]:
    """(peak, mean, end): device demand of the sessions over the arrival window (end: the last arrival),
    assuming nothing waits or idles."""
    end = float(max((s.arrival_s for s in specs), default=0.0))
    edges = sorted([(s.arrival_s, share(s.tier)) for s in specs] + [(s.arrival_s + s.duration_s, -share(s.tier))
                                                                   for s in specs])
    load = peak = area = last = 0.0  # the window starts at 0; warm-up sessions count from there
    for t, d in edges:
        if t > end:
            break
        if t >= 0:  # the load at 0 (the warm-up's sessions) counts too
            peak = max(peak, load)
        area += load * max(0.0, t - last)
        load, last = load + d, max(t, 0.0)
        if t >= 0:
            peak = max(peak, load)
    area += load * (end - last)
    return float(peak), float(area / max(end, 1e-9)), end


def static_hosts(load: float) -> int:
    """Hosts a static fleet needs for `load` devices of demand, each filled to the guard band."""
    return math.ceil(load / (1.0 - GUARD.busy_fraction))


def first_fit_hosts(specs: list[fleet_workload.SessionSpec]) -> int:
    """The hosts a first-fit replay of the trace opens so that no session ever waits (hence none is dropped):
    each arrival takes the first host in id order that fits it (the guard band's device time, slots and
    memory, as `libs.contracts.estimate` counts them), else a new one; a session holds its host for its
    whole life (static arms neither offload nor move)."""
    limit, slots = 1.0 - GUARD.busy_fraction, GUARD.max_sessions
    mem_room = HOST_MEMORY - int(GUARD.memory_fraction * HOST_MEMORY)
    events = sorted([(s.arrival_s + s.duration_s, 0, i) for i, s in enumerate(specs)]
                    + [(s.arrival_s, 1, i) for i, s in enumerate(specs)])  # leaves first at equal times
    hosts: list[list[float]] = []  # [busy, sessions, bytes]
    where: dict[int, int] = {}
    for _, arrive, i in events:
        sp = specs[i]
        need, size = share(sp.tier), ROW[sp.tier].state_bytes
        if not arrive:
            h = hosts[where.pop(i)]
            h[0], h[1], h[2] = h[0] - need, h[1] - 1, h[2] - size
            continue
        j = next((j for j, h in enumerate(hosts)
                  if h[0] + need <= limit + 1e-9 and h[1] + 1 <= slots and h[2] + size <= mem_room), len(hosts))
        if j == len(hosts):
            hosts.append([0.0, 0, 0])
        h = hosts[j]
        h[0], h[1], h[2] = h[0] + need, h[1] + 1, h[2] + size
        where[i] = j
    return len(hosts)


def progress(label: str, frac: float) -> None:
    print(f"  {label:<17} {100 * frac:5.1f}% simulated", file=sys.stderr, flush=True)


ARMS = ("static_peak", "static_average", "migration_only", "autoscaling_only", "turboserve", "statefleet")


def run_arms(specs: list[fleet_workload.SessionSpec], p: Params, end: float, peak_hosts: int, avg_hosts: int,
             only: tuple[str, ...] = ARMS, jobs: int = 1) -> dict:
    """Every arm over [0, end]. Static peak and migration only get `peak_hosts`, static average `avg_hosts`.

    With `jobs` > 1 the arms run in that many forked processes: each arm is its own deterministic `Sim` over
    the same sessions and shares nothing with the others, so the results are the same as run one by one."""
    start_hosts = p.min_hosts + p.warm_pool_hosts
    k = fleet_turboserve.sessions_per_gpu(specs, p, oracle_terms(), CAP_MS)
    turbo = fleet_turboserve.TurboServe(p, k)
    auto = arms.autoscaling_only_params(p)
    plan = [
        ("static_peak", arms.first_fit(p), arms.first_fit(p), p, peak_hosts),
        ("static_average", arms.first_fit(p), arms.first_fit(p), p, avg_hosts),
        ("migration_only", arms.policy(p, scaling=False, offload=False), arms.reacting(p), p, peak_hosts),
        ("autoscaling_only", arms.policy(auto, rebalancing=False, offload=False), arms.reacting(auto), auto,
         start_hosts),
        ("turboserve", turbo, turbo.react, p, start_hosts),
        ("statefleet", arms.policy(p), arms.reacting(p), p, start_hosts),
    ]
    global _ARM_RUNS
    _ARM_RUNS = {name: (specs, decide, react, arm_params, hosts, end) for name, decide, react, arm_params, hosts in plan
                 if name in only}
    names = list(_ARM_RUNS)
    try:
        if jobs > 1 and len(names) > 1:
            # fork: the children inherit the arms' closures, which cannot be pickled
            with ProcessPoolExecutor(min(jobs, len(names)), mp_context=multiprocessing.get_context("fork")) as pool:
                results = list(pool.map(_run_arm, names))
        else:
            results = [_run_arm(name) for name in names]
    finally:
        _ARM_RUNS = {}
    out = dict(zip(names, results, strict=True))
    if "turboserve" in out:
        out["turboserve"]["sessions_per_gpu"] = k
    return out


_ARM_RUNS: dict[str, tuple] = {}  # what `run_arms` hands `_run_arm`, by arm name (a forked child inherits it)


def _run_arm(name: str) -> dict:
    specs, decide, react, arm_params, hosts, end = _ARM_RUNS[name]
    t0 = time.perf_counter()
    r = Sim(specs, decide, arm_params, hosts, TICK_S, end, name, progress, react,
            stop_and_copy=name == "turboserve").run()
    r["wall_s"] = time.perf_counter() - t0
    print(f"  {name:<17} done in {r['wall_s']:.1f} s: {r['gpu_hours']:.1f} GPU-h, worst {r['worst_chunk_ms']:.0f} ms, "
          f"p99 {r['p99_chunk_ms']:.0f} ms, {r['migrations']} moves, {r['dropped_sessions']} dropped",
          file=sys.stderr, flush=True)
    return r


def over_target_worst(res: dict, cap_ms: float = CAP_MS) -> None:
    """How much of each arm's service is slower than the latency cap."""
    for r in res.values():
        r["over_target_worst_rate"] = share_over(r.pop("chunk_hist"), cap_ms)


def compare(res: dict, bound: dict) -> dict:
    peak, turbo, sf = res["static_peak"], res["turboserve"], res["statefleet"]
    for r in res.values():
        r["vs_static_peak"] = {"gpu_hours_ratio": _ratio(r["gpu_hours"], peak["gpu_hours"]),
                               "worst_chunk_ratio": _ratio(r["worst_chunk_ms"], peak["worst_chunk_ms"])}
        r["vs_turboserve"] = {"gpu_hours_ratio": _ratio(r["gpu_hours"], turbo["gpu_hours"]),
                              "worst_chunk_ratio": _ratio(r["worst_chunk_ms"], turbo["worst_chunk_ms"])}
    gpu_cut = 1 - sf["vs_static_peak"]["gpu_hours_ratio"]
    worst_cut = 1 - sf["vs_static_peak"]["worst_chunk_ratio"]
    over = bound["statefleet_over_bound_at_cap"]
    return {
        "worst_chunk_within_cap": _target(sf["worst_chunk_ms"], f"<= {CAP_MS}", sf["worst_chunk_ms"] <= CAP_MS),
        "gpu_hours_over_bound": _target(over, f"<= {BOUND_RATIO}", over <= BOUND_RATIO),
        "fewer_gpu_hours_than_turboserve": _target(sf["gpu_hours"] - turbo["gpu_hours"], "< 0",
                                                   sf["gpu_hours"] < turbo["gpu_hours"]),
        "lower_worst_chunk_than_turboserve": _target(sf["worst_chunk_ms"] - turbo["worst_chunk_ms"], "< 0",
                                                     sf["worst_chunk_ms"] < turbo["worst_chunk_ms"]),
        "no_dropped_sessions": _target(sf["dropped_sessions"], "== 0", sf["dropped_sessions"] == 0),
        # context: static peak is sized to drop nothing, its worst chunk is the guard band's
        "gpu_hours_cut_vs_static_peak": _target(gpu_cut, f">= {TARGETS['gpu_hours_cut_vs_static_peak']}",
                                                gpu_cut >= TARGETS["gpu_hours_cut_vs_static_peak"]),
        "worst_chunk_cut_vs_static_peak": _target(worst_cut, f">= {TARGETS['worst_chunk_cut_vs_static_peak']}",
                                                  worst_cut >= TARGETS["worst_chunk_cut_vs_static_peak"]),
    }


def oracle_terms() -> dict[int, lat.Term]:
    """Each tier's latency term on the simulator's profile rows: what the oracle packs by."""
    return {t: lat.term(CONTRACTS[t], ROW[t], share(t)) for t in ROW}


def oracle(specs: list[fleet_workload.SessionSpec], p: Params, res: dict, end: float) -> dict:
    """The clairvoyant bound (bench/fleet_oracle.py) over the arrival window at the cap, at static peak's worst
    and at statefleet's, and the gap between statefleet and the bound at the cap split into floors an
    online policy cannot close (measured on the same sessions):

    - keep-warm: a resume copies the state back (4 GiB at 20 GB/s: ~0.2 s), a chunk past the cap, so a
      policy held to the cap cannot offload idle sessions; the bound that keeps them all on a device;
    - boot: each host the (keep-warm) bound adds is paid a boot before it serves, unless one kept from an
      earlier fall is still there (`fleet_oracle.boot_floor`): the price with arrivals known one boot ahead;
    - whole-host packing: the clairvoyant's class-per-host schedule over the bound (an estimate: the
      truth lies between the two).
    """
    terms = oracle_terms()
    peak, sf = res["static_peak"], res["statefleet"]
    at_cap = fleet_oracle.gpu_hours(specs, p, terms, CAP_MS, until_s=end)
    at_peak = fleet_oracle.gpu_hours(specs, p, terms, peak["worst_chunk_ms"], until_s=end)
    at_sf = fleet_oracle.gpu_hours(specs, p, terms, sf["worst_chunk_ms"], until_s=end)
    warm = fleet_oracle.gpu_hours(specs, p, terms, CAP_MS, until_s=end, suspend=False, series=True)
    wave = fleet_oracle.burst(specs, p, terms, CAP_MS, PROVISION_S)
    state = sorted(s.state_bytes for s in specs)[len(specs) // 2] if specs else 0
    resume_ms = min(lat.chunk_ms(p, t, t.share, 1) for t in terms.values()) + 1e3 * state / RESUME_BPS
    keep_warm = max(0.0, warm["gpu_hours"] - at_cap["gpu_hours"]) if resume_ms > CAP_MS else 0.0
    steps = warm.pop("series", [])
    warmed = steps[0][1] if steps and any(s.arrival_s < 0 for s in specs) else 0  # booted in the warm-up
    boot = fleet_oracle.boot_floor(steps, PROVISION_S, warmed) if warm["reachable"] else math.inf
    packing = max(0.0, warm["gpu_hours_packed"] - warm["gpu_hours"])
    floor = at_cap["gpu_hours"] + keep_warm + boot + packing
    return {
        "at_cap": at_cap, "at_static_peak_worst": at_peak, "at_statefleet_worst": at_sf, "keep_warm_bound": warm,
        "largest_boot_window_burst": wave,
        "decomposition": {
            "bound_gpu_hours": at_cap["gpu_hours"], "median_resume_cut_over_ms": resume_ms,
            "keep_warm_gpu_hours": keep_warm, "boot_gpu_hours": boot, "whole_host_packing_gpu_hours": packing,
            "online_floor_gpu_hours": floor, "online_floor_over_bound": _ratio(floor, at_cap["gpu_hours"]),
            "statefleet_over_online_floor": _ratio(sf["gpu_hours"], floor),
            "statefleet_rest_gpu_hours": sf["gpu_hours"] - floor},
        "statefleet_over_bound_at_cap": _ratio(sf["gpu_hours"], at_cap["gpu_hours"]),
        "statefleet_over_bound_at_its_worst": _ratio(sf["gpu_hours"], at_sf["gpu_hours"]),
    }


def _ratio(a: float, b: float) -> float:
    return a / b if b else math.nan


def _target(value: float, goal: str, met: bool) -> dict:
    return {"value": value, "target": goal, "met": met}


def plot(path: Path, res: dict, title: str, oracle_steps: list[tuple[float, int]] | None = None,
         oracle_label: str = "") -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    for name, r in res.items():
        hours = [t / 3600 for t in r["series"]["t_s"]]
        top.plot(hours, r["series"]["gpus"], lw=1, label=name)
        bottom.plot(hours, r["series"]["p99_chunk_ms"], lw=1, label=name)
    if oracle_steps:
        top.step([t / 3600 for t, _ in oracle_steps], [h for _, h in oracle_steps], where="post", lw=0.8,
                 color="black", ls="--", label=oracle_label)
    bottom.axhline(CAP_MS, color="black", ls=":", lw=0.8, label=f"cap {CAP_MS} ms")
    top.set_ylabel("GPUs in use")
    bottom.set_ylabel("p99 chunk latency (ms)")
    bottom.set_yscale("log")
    bottom.set_xlabel("simulated time (h)")
    top.set_title(title)
    top.legend(fontsize=7, ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


def summary(res: dict, targets: dict, bound: dict) -> None:
    print(f"\n  {'arm':<17} {'GPU-h':>8} {'worst ms':>9} {'p99 ms':>7} {'> cap':>7} {'moves':>6} {'S&C':>5} "
          f"{'dropped':>7} {'start p99 s':>11} {'GPU-h/peak':>10}")
    for name, r in res.items():
        print(f"  {name:<17} {r['gpu_hours']:8.1f} {r['worst_chunk_ms']:9.1f} {r['p99_chunk_ms']:7.1f} "
              f"{r['over_target_worst_rate']:7.4f} {r['migrations']:6d} {r['stop_and_copy_moves']:5d} "
              f"{r['dropped_sessions']:7d} {r['start_delay_p99_s']:11.1f} {r['vs_static_peak']['gpu_hours_ratio']:10.3f}")
    print()
    table([(k, v["value"], f"target {v['target']}: {'met' if v['met'] else 'MISSED'}") for k, v in targets.items()])
    d = bound["decomposition"]
    print(f"\n  bound at the cap ({CAP_MS} ms): {d['bound_gpu_hours']:.1f} GPU-h; statefleet "
          f"{bound['statefleet_over_bound_at_cap']:.2f}x. Floors an online policy cannot close: keep-warm "
          f"+{d['keep_warm_gpu_hours']:.1f} (a resume is a {d['median_resume_cut_over_ms']:.0f} ms chunk), boot "
          f"+{d['boot_gpu_hours']:.1f}, whole-host packing +{d['whole_host_packing_gpu_hours']:.1f} -> "
          f"{d['online_floor_gpu_hours']:.1f} ({d['online_floor_over_bound']:.2f}x the bound); statefleet "
          f"{d['statefleet_over_online_floor']:.2f}x that")


def main() -> None:
    ap = parser("fleet", __doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, help="a trace file (Azure CSV, Mooncake JSONL, ServeGen client windows)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--latency-model", choices=("profile", "colocation"), default="profile")
    ap.add_argument("--colocation-curve", type=Path,
                    help="JSON chunk time vs co-located sessions (bench/fleet_colocation.Curve) to fit the colocation "
                         "model from; default: the profile model's own curve")
    args = ap.parse_args()
    size = QUICK if args.quick else FULL
    try:
        kind, specs, shape = workload(args.trace, args.seed, size)
        curve, fitted = colocation_fit(args.colocation_curve)
    except (fleet_trace.TraceError, fleet_colocation.CurveError, OSError, UnicodeDecodeError) as e:
        sys.exit(f"bench.fleet: cannot read the {'curve' if isinstance(e, fleet_colocation.CurveError) else 'trace'}: {e}")
    if not specs:
        sys.exit("the trace yielded no sessions")
    peak, mean, end = offered(specs)
    peak_hosts, avg_hosts = first_fit_hosts(specs), max(1, static_hosts(mean))
    print(f"{kind}: {len(specs)} sessions, arrivals over {end / 3600:.2f} h; offered load peak {peak:.1f} / mean "
          f"{mean:.1f} devices -> static peak {peak_hosts} hosts (first fit; {static_hosts(peak)} at perfect packing), "
          f"static average {avg_hosts}", file=sys.stderr)
    print(f"colocation model: alpha {fitted.alpha:.3f}, solo {fitted.solo_ms:.2f} ms, rmse {fitted.rmse_ms:.2f} ms "
          f"from {len(curve.sessions)} points ({curve.source})", file=sys.stderr)
    p = params(args.latency_model, fitted.alpha if args.latency_model == "colocation" else None)
    # one process per arm, as many at once as the machine has cores for
    res = run_arms(specs, p, end, peak_hosts, avg_hosts, jobs=len(os.sched_getaffinity(0)))
    over_target_worst(res)
    bound = oracle(specs, p, res, end)
    targets = compare(res, bound)
    steps = fleet_oracle.gpu_hours(specs, p, oracle_terms(), CAP_MS, series=True, until_s=end).get("series")
    png = plot(args.json.with_suffix(".png"), res, f"{kind} trace, seed {args.seed}, {args.latency_model} model"
               + (" (quick)" if args.quick else ""), steps, f"bound at the {CAP_MS} ms cap")
    summary(res, targets, bound)
    write(args.json, {
        "benchmark": "fleet", "quick": args.quick, "seed": args.seed,
        "trace": str(args.trace) if args.trace else None, "workload": shape | {
            "offered_peak_devices": peak, "offered_mean_devices": mean, "span_h": end / 3600,
            "window": "arrivals", "static_peak_hosts": peak_hosts, "static_peak_hosts_perfect_packing":
                static_hosts(peak), "static_average_hosts": avg_hosts},
        "latency_cap_ms": CAP_MS, "bound_gpu_hours_at_cap": bound["at_cap"]["gpu_hours"],
        "gpu_hours_over_bound": bound["statefleet_over_bound_at_cap"],
        "model": {"tick_s": TICK_S, "period_ms": PERIOD_MS, "provision_s": PROVISION_S, "latency_model":
                  args.latency_model, "colocation_curve": msgspec.to_builtins(curve),
                  "colocation_fit": fitted._asdict(), "profile_rows": msgspec.to_builtins(PROFILE),
                  "params": msgspec.to_builtins(p)},
        "arms": res, "targets": targets, "oracle": bound, "plot": png})


if __name__ == "__main__":
    main()
