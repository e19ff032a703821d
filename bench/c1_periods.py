"""Admitted C1 sessions keep their period under `statefleet up`, and admission admits what the device carries.

    python -m bench.c1_periods [--quick] [--sessions N] [--period-ms MS] [--seconds S] [--rounds R]
                               [--mix] [--overload] --json PATH

Each round starts a fresh stack exactly as `statefleet up` starts one by default (two CPU engine hosts
on this machine, which share its cores; no environment setting of its own) and offers `--sessions` C1
world sessions at once, each at a `--period-ms` period with the backend's lowest tier as its floor.
`--overload` offers 1.0×, 1.4× and 2× the capacity the stack found instead; `--mix` offers C1, C2 and
C3 sessions of all three built-in backends together. A session placed (201, or 202 and placed within
admission's queue timeout) is watched for `--seconds`: a block's period is the time between the
arrival of its first chunk and the previous block's, at the client. A refused one is counted with its
reason.

Per round: every admitted C1 session's `p95_period_ms` and `p95_over_contract` (worst, median,
`late_sessions` past 1.10×), the host's own view at publish (`host_p95_*`, with tier and skipped blocks),
`busy_fraction_max` (the highest share of wall time any device had a block in flight, its hosts
together, from their measured stage timings in the heartbeats, not from the model's prices) and
`over_capacity_s` (device-seconds above the limit), and `capacity_found` (how many such sessions the
device's capacity, measured under co-location, carries within the period) beside
`capacity_baseline`: the most of the same sessions' blocks that run back to back on the backend alone,
without the stack, within one period, measured in the same run between rounds.

Targets (every round): p95 ≤ 1.10× the contract for every admitted C1 session; busy_fraction_max ≤
the limit + 0.05; 0 unanswered; the excess queued or refused with a reason; capacity_found within
15 % of the baseline.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import aiohttp
import torch

from bench import common
from bench.frontend import SessionClient, c1_contract
from bench.load import live_hosts, offer
from bench.stack import UpStack
from libs import bus, names
from libs import capacity_model as cm
from libs.contracts import Guard, device_key
from libs.schemas.base import decode
from libs.schemas.capacity import Kind
from libs.schemas.common import EngineEntry
from libs.schemas.engine import OutputChunk, SessionInit
from services.admission.service import AdmissionConfig
from services.engine_host.backends import Registry, make_backend
from services.engine_host.service import torch_thread_count
from statefleet.engines import host_statuses

TARGET_RATIO = 1.10  # p95 period within 10 % of the contract
LIMIT = 1 - Guard().busy_fraction
BUSY_TARGET = LIMIT + 0.05
CAPACITY_TOLERANCE = 0.15
OVERLOAD = (1.0, 1.4, 2.0)
QUEUE_TIMEOUT_S = AdmissionConfig().queue_timeout_s  # the stack's own: the bench sets nothing


def periods_ms(c: SessionClient, start: float, end: float) -> list[float]:
    live = [a for a in c.live_blocks() if start <= a.at < end]
    return [(b.at - a.at) * 1000 for a, b in zip(live, live[1:], strict=False)]


def p95(xs: list[float]) -> float:
    return sorted(xs)[min(len(xs) - 1, int(0.95 * (len(xs) - 1) + 0.5))] if xs else float("nan")


def found(hosts: list[EngineEntry], period_ms: float) -> int:
    """How many world sessions at their lowest tier the device's measured capacity carries (one device
    here: the two hosts share the machine's CPU, and report its capacity once)."""
    cap = next(h.capacity for h in hosts if h.capacity is not None)
    floor = min(c.tier for c in cap.curves if c.backend == "world")
    return cm.sessions_within(cap, Kind(backend="world", tier=floor, window_ms=period_ms), LIMIT)


def baseline(period_ms: float, top: int = 256) -> dict:
    """The same sessions' blocks back to back on the backend alone, in this process, without the stack:
    the most N whose N blocks (the lowest tier) fit in one period."""
    torch.set_num_threads(torch_thread_count(0, torch.device("cpu"), 1))
    b = make_backend(Registry(), "world", b"", torch.device("cpu"))
    tier = b.tiers[0]
    states: list[dict] = []
    best, rounds = 0, {}
    for n in range(1, top + 1):
        states.append(b.init_state(n, SessionInit(prompt="baseline")))
        walls = []
        for _ in range(3):
            t0 = time.perf_counter()
            for s in states:
                b.decode(s, b.denoise(s, b.encode(s, []), tier))
            walls.append((time.perf_counter() - t0) * 1000)
        rounds[n] = statistics.median(walls)
        if rounds[n] > period_ms:
            break
        best = n
    return {"sessions": best, "round_ms": rounds}


def offers(args, capacity: int, level: float) -> list[tuple[str, dict]]:
    """(backend, contract) of every session offered in one round."""
    if args.mix:
        out = []
        for backend in ("world", "avatar", "dit"):
            out += [(backend, c1_contract(None))] * 2  # the period each backend's media implies
            out += [(backend, {"session_class": "C2a", "quality_floor": 1, "determinism": "T1",
                               "deadline_ms": 4 * args.period_ms})]
            out += [(backend, {"session_class": "C3", "quality_floor": 1, "determinism": "T2"})]
        return out
    n = max(1, round(level * capacity)) if args.overload else args.sessions
    return [("world", c1_contract(args.period_ms))] * n


async def watch_devices(nc, stop: asyncio.Event, every_s: float = 0.5) -> dict:
    """Poll the heartbeats: each device's measured in-flight share (its hosts together) and model load."""
    kv = await nc.jetstream().key_value(names.ENGINES_BUCKET)
    busy_max = model_max = over_s = 0.0
    while not stop.is_set():
        try:
            hosts = [decode(e.value, EngineEntry) for e in await bus.kv_entries(kv)]
        except Exception:  # a bus hiccup: the next poll reads it
            hosts = []
        devices: dict[str, list[EngineEntry]] = {}
        for h in hosts:
            devices.setdefault(device_key(h), []).append(h)
        for peers in devices.values():
            busy = sum(h.busy_measured for h in peers)
            busy_max = max(busy_max, busy)
            model_max = max(model_max, sum(h.busy_fraction for h in peers))
            over_s += every_s if busy > LIMIT else 0.0
        try:
            await asyncio.wait_for(stop.wait(), every_s)
        except TimeoutError:
            pass
    return {"busy_fraction_max": busy_max, "model_busy_fraction_max": model_max, "over_capacity_s": over_s}


async def run(args, tmp: Path, level: float = 1.0) -> dict:
    stack = UpStack(tmp / "stack", engines=args.engines).start()
    try:
        await stack.ready()
        nc = await bus.connect(stack.cli_url(), name="bench-c1-periods")
        hosts = await live_hosts(nc, args.engines)
        capacity = found(hosts, args.period_ms)
        wanted = offers(args, capacity, level)
        async with aiohttp.ClientSession(headers=stack.admin_headers()) as http:
            outcomes = await asyncio.gather(*(offer(nc, http, stack.admission_url, contract, i + 1, backend=backend,
                                                    queue_timeout_s=QUEUE_TIMEOUT_S)
                                              for i, (backend, contract) in enumerate(wanted)))
            clients, classes = [], {}
            for (backend, contract), (kind, body) in zip(wanted, outcomes, strict=True):
                cls = f"{contract['session_class']}/{backend}"
                classes.setdefault(cls, {"offered": 0, "admitted": 0})
                classes[cls]["offered"] += 1
                if kind == "admitted":
                    classes[cls]["admitted"] += 1
                if kind == "admitted" and contract["session_class"] == "C1":
                    c = SessionClient(sid=body["session_id"], token=body["input_token"], input_url=body["input_url"],
                                      host_id=body.get("host_id", ""), period_s=body["contract"]["period_ms"] / 1000)
                    await bus.subscribe_events(nc, names.output_subject(c.sid), OutputChunk, c.on_chunk)
                    clients.append(c)
            await asyncio.sleep(args.settle_s)  # past start-up and the first step-downs
            stop = asyncio.Event()
            watcher = asyncio.create_task(watch_devices(nc, stop))
            start = time.monotonic()
            await asyncio.sleep(args.seconds)
            end = time.monotonic()
            stop.set()
            devices = await watcher
        hosts = await live_hosts(nc, args.engines)
        statuses = [st for st in await host_statuses(stack.cli_url()) if not isinstance(st, str)]
        await nc.close()
    finally:
        stack.stop()
    return score(args, outcomes, clients, classes, hosts, statuses, devices, start, end, capacity, level)


def score(args, outcomes, clients, classes, hosts, statuses, devices, start, end, capacity, level) -> dict:
    per = {}
    for c in clients:
        ps = periods_ms(c, start, end)
        per[c.sid] = {"host_id": c.host_id, "blocks": len(ps) + 1 if ps else 0, "contract_ms": c.period_s * 1000,
                      "p50_period_ms": statistics.median(ps) if ps else float("nan"), "p95_period_ms": p95(ps),
                      "p95_over_contract": p95(ps) / (c.period_s * 1000)}
    served = {m.session_id: m for st in statuses for m in st.metrics}
    for sid, r in per.items():
        m = served.get(sid)
        if m is not None:  # the host's own view: periods at publish, before the bus and this client
            r |= {"host_p95_period_ms": m.chunk_period_p95_ms, "tier": m.tier, "tier_changes": m.tier_changes,
                  "skipped_blocks": m.skipped_blocks, "playout_hold_p95_ms": m.playout_hold_p95_ms,
                  "control_to_output_p95_ms": m.control_to_output_p95_ms}
    ratios = [r["p95_over_contract"] for r in per.values()]
    host_ratios = [r["host_p95_period_ms"] / r["contract_ms"] for r in per.values() if "host_p95_period_ms" in r]
    holds = [r["playout_hold_p95_ms"] for r in per.values() if "playout_hold_p95_ms" in r]
    reasons: dict[str, int] = {}
    for kind, body in outcomes:
        if kind == "rejected":
            r = body.get("reason") or (body.get("verdict") or {}).get("reason") or body.get("code") or "?"
            reasons[r] = reasons.get(r, 0) + 1
    return {
        "level": level, "offered": len(outcomes), "admitted": sum(k == "admitted" for k, _ in outcomes),
        "admitted_c1": len(clients), "classes": classes,
        "rejected_explicitly": sum(k == "rejected" for k, _ in outcomes), "rejected_reasons": reasons,
        "unanswered": sum(k == "unanswered" for k, _ in outcomes),
        "p95_over_contract_worst": max(ratios, default=float("nan")),
        "p95_over_contract_median": statistics.median(ratios) if ratios else float("nan"),
        "within_10pct": bool(ratios) and max(ratios) <= TARGET_RATIO,
        "late_sessions": sum(r > TARGET_RATIO for r in ratios),
        "skipped_blocks_max": max((r.get("skipped_blocks", 0) for r in per.values()), default=0),
        "host_p95_over_contract_worst": max(host_ratios, default=float("nan")),
        "host_p95_over_contract_median": statistics.median(host_ratios) if host_ratios else float("nan"),
        "playout_hold_p95_ms_worst": max(holds, default=float("nan")),
        "playout_hold_p95_ms_median": statistics.median(holds) if holds else float("nan"),
        **devices, "capacity_found": capacity,
        "hosts": {h.host_id: {"machine": h.machine, "device": h.device, "sessions": h.sessions,
                              "busy_fraction": h.busy_fraction, "served_fraction": h.served_fraction,
                              "busy_measured": h.busy_measured} for h in hosts},
        "sessions": per,
    }


def summary(rounds: list[dict]) -> dict:
    """Over rounds: the median of each round's worst and median ratio, and the worst round."""
    worst = [r["p95_over_contract_worst"] for r in rounds]
    return {
        "p95_over_contract_worst": max(worst), "p95_over_contract_worst_median": statistics.median(worst),
        "p95_over_contract_median": statistics.median(r["p95_over_contract_median"] for r in rounds),
        "host_p95_over_contract_worst": max(r["host_p95_over_contract_worst"] for r in rounds),
        "playout_hold_p95_ms_median": statistics.median(r["playout_hold_p95_ms_median"] for r in rounds),
        "playout_hold_p95_ms_worst": max(r["playout_hold_p95_ms_worst"] for r in rounds),
        "admitted": min(r["admitted"] for r in rounds),
        "within_10pct": all(r["within_10pct"] for r in rounds),
        "late_sessions": max(r["late_sessions"] for r in rounds),
        "busy_fraction_max": max(r["busy_fraction_max"] for r in rounds),
        "over_capacity_s": max(r["over_capacity_s"] for r in rounds),
        "unanswered": sum(r["unanswered"] for r in rounds),
    }


def main() -> None:
    p = common.parser("c1_periods", __doc__.splitlines()[0])
    p.add_argument("--engines", type=int, default=2)
    p.add_argument("--sessions", type=int, default=16)
    p.add_argument("--period-ms", type=float, default=67.0)
    p.add_argument("--seconds", type=float, default=None)
    p.add_argument("--settle-s", type=float, default=5.0)
    p.add_argument("--rounds", type=int, default=3, help="rounds (at least 3), each a fresh stack")
    p.add_argument("--mix", action="store_true", help="C1, C2 and C3 sessions of all three backends")
    p.add_argument("--overload", action="store_true", help="offer 1.0x, 1.4x and 2x the capacity found")
    args = p.parse_args()
    args.seconds = args.seconds or (10.0 if args.quick else 30.0)
    args.rounds = max(3, args.rounds)
    levels = OVERLOAD if args.overload else (1.0,)
    rounds: list[dict] = []
    for i in range(args.rounds):  # each round: the stack's levels, then the baseline with the stack stopped
        for level in levels:
            print(f"round {i + 1}/{args.rounds}" + (f": {level}x" if args.overload else ""), flush=True)
            with tempfile.TemporaryDirectory() as tmp:
                r = asyncio.run(run(args, Path(tmp), level))
            base = baseline(args.period_ms)
            r |= {"capacity_baseline": base["sessions"], "baseline_round_ms": base["round_ms"],
                  "capacity_vs_baseline": r["capacity_found"] / base["sessions"] if base["sessions"] else float("nan")}
            rounds.append(r)
    res = {**rounds[-1], **summary(rounds)}
    ratios = [r["capacity_vs_baseline"] for r in rounds]
    res["capacity_vs_baseline_median"] = statistics.median(ratios)
    common.table([
        *((f"round {i + 1}" + (f" {r['level']}x" if args.overload else ""),
           f"offered {r['offered']} admitted {r['admitted']} (C1 {r['admitted_c1']}), "
           f"p95/contract worst {r['p95_over_contract_worst']:.3f} median {r['p95_over_contract_median']:.3f}, "
           f"late {r['late_sessions']}, busy max {r['busy_fraction_max']:.2f} (model {r['model_busy_fraction_max']:.2f}),"
           f" over {r['over_capacity_s']:.1f} s, capacity {r['capacity_found']} vs baseline {r['capacity_baseline']},"
           f" refused {r['rejected_reasons']}, unanswered {r['unanswered']}", "")
          for i, r in enumerate(rounds)),
        ("p95 period / contract: worst round, median",
         f"{res['p95_over_contract_worst']:.3f}, {res['p95_over_contract_median']:.3f}",
         f"target <= {TARGET_RATIO}: {'met' if res['within_10pct'] else 'MISSED'}"),
        ("busy_fraction_max (measured)", f"{res['busy_fraction_max']:.2f}",
         f"target <= {BUSY_TARGET:.2f}: {'met' if res['busy_fraction_max'] <= BUSY_TARGET else 'MISSED'}"),
        ("capacity found / baseline (median)", f"{res['capacity_vs_baseline_median']:.2f}",
         f"target within {CAPACITY_TOLERANCE:.0%}"),
    ])
    common.write(args.json, {"benchmark": "c1_periods", "quick": args.quick, "engines": args.engines,
                             "period_ms": args.period_ms, "seconds": args.seconds, "rounds": args.rounds,
                             "mix": args.mix, "overload": args.overload, **res, "rounds_paced": rounds,
                             # the unpaced arm set SF_C1_PACING, which `statefleet up` does not: removed
                             "unpaced": None, "rounds_unpaced": [],
                             "target": {"p95_over_contract_max": TARGET_RATIO, "busy_fraction_max": BUSY_TARGET,
                                        "capacity_vs_baseline_within": CAPACITY_TOLERANCE}})


if __name__ == "__main__":
    main()
