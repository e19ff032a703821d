"""Admitted C1 sessions keep their period under `statefleet up`: p95 block period against the contract.

    python -m bench.c1_periods [--quick] [--sessions N] [--period-ms MS] [--seconds S] [--rounds R]
                               [--mix] [--overload] --json PATH

A fresh stack per round, started exactly as `statefleet up` starts one by default (embedded NATS,
every service, `--engines` CPU engine hosts on this machine, which share its cores; the bench sets no
`SF_*` setting of its own), is offered `--sessions` C1 world sessions at once, each at a
`--period-ms` period with the backend's lowest tier as its quality floor. A session placed (201,
or 202 and placed within admission's queue timeout) is watched for `--seconds`: the period of a
block is the time between the arrival of its first chunk and the previous block's, at the client.
A refused one is counted with its reason. At least 3 rounds, each reported (`rounds`).

Per round, beside the periods: `busy_fraction_max`, the highest load any device carried while
watched (its hosts' stage seconds over wall time, all hosts of the device together, as the hosts
measured them: `EngineEntry.measured_fraction`, not the model's prices), `over_capacity_s`
(device-seconds above the admission limit 1 - guard), `late_sessions` (admitted C1 sessions whose
p95 period passed 1.10x the contract), `capacity_model` (how many such sessions the capacity model,
`libs.contracts.carried`, found the stack's devices take, from the hosts' start-up profiles) and
`capacity_baseline` (the same number of sessions' blocks back to back on the backend alone, without
the stack, just before the round: `bench/c1_baseline.py`). Diagnostics beside them: each admitted
session's `priced_share` (what admission priced it at) and `measured_share` (its blocks' mean stage
time over its period, while co-located), summed per host in `priced_vs_measured_by_host`, and
`engine_cpu_fraction` (each engine-host process's CPU seconds over wall time while watched, every
thread: what the stage timings cannot see on a CPU device, `bench/proc_cpu.py`).

`--mix`: C1 world, C2a avatar and C3 dit sessions arriving together (C1 periods are measured; the
others count in admission and in the device's load). `--overload`: rounds offered at 1.0x, 1.4x and
2x the capacity the model found (interleaved), for "no admitted session misses more at 1.4x".

Output pacing (C1 blocks released on the period grid) is the default and is what is measured; an
unpaced arm would need a setting `statefleet up` does not set, so there is none.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import tempfile
import time
from pathlib import Path

import aiohttp
import msgspec

from bench import common
from bench.c1_baseline import back_to_back
from bench.frontend import SessionClient, c1_contract
from bench.load import live_hosts, offer
from bench.proc_cpu import engine_cpu_s
from bench.stack import UpStack
from libs import bus, names
from libs.contracts import Contract, Guard, carried, device_key
from libs.schemas.base import decode
from libs.schemas.common import EngineEntry, SessionNotice, SessionSummary
from libs.schemas.engine import OutputChunk
from services.admission.service import AdmissionConfig
from statefleet.engines import host_statuses
from statefleet.status import read_bucket

TARGET_RATIO = 1.10  # p95 period within 10 % of the contract
LIMIT = 1.0 - Guard().busy_fraction  # the admission limit of a device's load
OVERLOAD_LEVELS = (1.0, 1.4, 2.0)
SAMPLE_S = 0.5
QUEUE_TIMEOUT_S = AdmissionConfig().queue_timeout_s  # the stack's: admission's default


def periods_ms(c: SessionClient, start: float, end: float) -> list[float]:
    live = [a for a in c.live_blocks() if start <= a.at < end]
    return [(b.at - a.at) * 1000 for a, b in zip(live, live[1:], strict=False)]


def p95(xs: list[float]) -> float:
    return sorted(xs)[min(len(xs) - 1, int(0.95 * (len(xs) - 1) + 0.5))] if xs else float("nan")


def offered_mix(n: int, period_ms: float, mix: bool) -> list[tuple[dict, str]]:
    """(contract, backend) per session: all C1 world, or C1 world / C2a avatar / C3 dit in turn."""
    kinds = [(c1_contract(period_ms), "world")]
    if mix:
        kinds += [({"session_class": "C2a", "quality_floor": 1, "determinism": "T1", "deadline_ms": 2000.0}, "avatar"),
                  ({"session_class": "C3", "quality_floor": 1, "determinism": "T0"}, "dit")]
    return [kinds[i % len(kinds)] for i in range(n)]


async def device_loads(nc) -> dict[str, float]:
    """Each device's measured load now: the sum over its hosts of what they measured."""
    kv = await nc.jetstream().key_value(names.ENGINES_BUCKET)
    loads: dict[str, float] = {}
    with contextlib.suppress(Exception):
        for k in await kv.keys():
            e = decode((await kv.get(k)).value, EngineEntry)
            loads[device_key(e)] = loads.get(device_key(e), 0.0) + e.measured_fraction
    return loads


async def run(args, tmp: Path, sessions: int) -> dict:
    contract = c1_contract(args.period_ms)
    baseline = back_to_back("world", sessions=sessions, floor=contract["quality_floor"], period_ms=args.period_ms,
                            hosts=args.engines)
    stack = UpStack(tmp / "stack", engines=args.engines).start()
    assert stack.proc is not None
    up_pid = stack.proc.pid  # the engine hosts are its descendants
    samples: list[tuple[float, dict[str, float]]] = []
    try:
        await stack.ready()
        nc = await bus.connect(stack.cli_url(), name="bench-c1-periods")
        hosts = await live_hosts(nc, args.engines)
        found = carried(msgspec.convert(contract, Contract), "world", hosts, Guard())
        told = Notices()
        async with aiohttp.ClientSession(headers=stack.admin_headers()) as http:
            offers = offered_mix(sessions, args.period_ms, args.mix)
            outcomes = await asyncio.gather(*(offer(nc, http, stack.admission_url, c, i + 1, backend=b,
                                                    queue_timeout_s=QUEUE_TIMEOUT_S)
                                              for i, (c, b) in enumerate(offers)))
            clients = []
            for (c, _), (kind, body) in zip(offers, outcomes, strict=True):
                if kind == "admitted" and c["session_class"] == "C1":
                    cl = SessionClient(sid=body["session_id"], token=body["input_token"], input_url=body["input_url"],
                                       host_id=body.get("host_id", ""), period_s=body["contract"]["period_ms"] / 1000)
                    await bus.subscribe_events(nc, names.output_subject(cl.sid), OutputChunk, cl.on_chunk)
                    await bus.subscribe_events(nc, names.notice_subject(cl.sid), SessionNotice, told.heard)
                    clients.append(cl)
            start = time.monotonic() + args.settle_s  # past start-up and the first step-downs
            end = start + args.seconds
            cpu0: dict[str, float] | None = None
            while (now := time.monotonic()) < end:
                loads = await device_loads(nc)
                if now >= start:
                    samples.append((now, loads))
                    if cpu0 is None:
                        cpu0, cpu0_at = engine_cpu_s(up_pid), now
                await asyncio.sleep(SAMPLE_S)
            cpu1 = engine_cpu_s(up_pid)
            cpu = {h: (cpu1[h] - cpu0[h]) / (time.monotonic() - cpu0_at) for h in cpu1 if cpu0 and h in cpu0}
            priced = {c.sid: await priced_share(http, stack.admission_url, c.sid) for c in clients}
        hosts = await live_hosts(nc, args.engines)
        # what `statefleet status` shows of each session: a shed one is marked there (a notice sent before this
        # client subscribed, while the offers were still being answered, is missed by `told`)
        for m in await read_bucket(nc.jetstream(), names.SESSIONS_BUCKET, SessionSummary):
            told.shown[m.session_id] = m.shed
        statuses = [st for st in await host_statuses(stack.cli_url()) if not isinstance(st, str)]
        await nc.close()
    finally:
        stack.stop()
    return report(args, outcomes, offers, clients, start, end, hosts, statuses, samples, found, baseline, priced,
                  told) | {"engine_cpu_fraction": cpu}


class Notices:
    """Every `SessionNotice` the watched sessions' clients were sent (shed, capacity lost, resumed)."""

    def __init__(self) -> None:
        self.by_session: dict[str, list[str]] = {}
        self.shown: dict[str, str] = {}  # session → its summary's shed mark at the end ("" if none)

    async def heard(self, n: SessionNotice) -> None:
        self.by_session.setdefault(n.session_id, []).append(n.kind)


async def priced_share(http: aiohttp.ClientSession, admission_url: str, sid: str) -> float:
    """The device share admission priced the session at when it placed it (its recorded demand)."""
    with contextlib.suppress(aiohttp.ClientError, TimeoutError, KeyError):
        async with http.get(f"{admission_url}/v1/sessions/{sid}", timeout=aiohttp.ClientTimeout(total=5)) as r:
            return float((await r.json(content_type=None))["metrics"]["busy_fraction"])
    return float("nan")


def report(args, outcomes, offers, clients, start, end, hosts, statuses, samples, found, baseline, priced,
           told) -> dict:
    per = {}
    for c in clients:
        ps = periods_ms(c, start, end)
        per[c.sid] = {"host_id": c.host_id, "blocks": len(ps) + 1 if ps else 0, "contract_ms": c.period_s * 1000,
                      "p50_period_ms": statistics.median(ps) if ps else float("nan"), "p95_period_ms": p95(ps),
                      "p95_over_contract": p95(ps) / (c.period_s * 1000), "notices": told.by_session.get(c.sid, []),
                      "shed_in_status": told.shown.get(c.sid, "")}
    served = {m.session_id: m for st in statuses for m in st.metrics}
    for sid, r in per.items():
        m = served.get(sid)
        # What admission priced the session at, beside what its blocks measured while co-located (every
        # stage's mean over the period): the two differ where pricing misses what really runs.
        r["priced_share"] = priced.get(sid, float("nan"))
        if m is not None:  # the host's own view: periods at publish, before the bus and this client
            stage_ms = sum(t.mean_ms for t in m.stages)
            r |= {"stage_ms_mean": stage_ms, "measured_share": stage_ms / r["contract_ms"]}
            r |= {"host_p95_period_ms": m.chunk_period_p95_ms, "tier": m.tier, "tier_changes": m.tier_changes,
                  "skipped_blocks": m.skipped_blocks, "playout_hold_p95_ms": m.playout_hold_p95_ms,
                  "control_to_output_p95_ms": m.control_to_output_p95_ms}
    # A session with no period watched was not served in the window: told (shed, capacity lost) or not,
    # it is counted apart, never as a ratio (a NaN would hide every other session's)
    ratios = [r["p95_over_contract"] for r in per.values() if r["blocks"] >= 2]
    unwatched = [r for r in per.values() if r["blocks"] < 2]
    host_ratios = [r["host_p95_period_ms"] / r["contract_ms"] for r in per.values() if "host_p95_period_ms" in r]
    holds = [r["playout_hold_p95_ms"] for r in per.values() if "playout_hold_p95_ms" in r]
    reasons: dict[str, int] = {}
    for kind, body in outcomes:
        if kind == "rejected":
            why = body.get("reason") or (body.get("verdict") or {}).get("reason") or body.get("code") or "?"
            reasons[why] = reasons.get(why, 0) + 1
    loads = [max(d.values(), default=0.0) for _, d in samples]
    over = sum(SAMPLE_S * sum(max(0.0, v - LIMIT) > 0 for v in d.values()) for _, d in samples)
    model = sum(found.values())
    by_host: dict[str, list[dict]] = {}
    for r in per.values():
        by_host.setdefault(r["host_id"], []).append(r)
    pricing = {h: {"sessions": len(rs), "priced": sum(r["priced_share"] for r in rs),
                   "measured": sum(r.get("measured_share", 0.0) for r in rs)} for h, rs in by_host.items()}
    return {
        "offered": len(offers), "admitted": sum(k == "admitted" for k, _ in outcomes),
        "admitted_c1": len(clients),
        "rejected_explicitly": sum(k == "rejected" for k, _ in outcomes), "rejected_reasons": reasons,
        "unanswered": sum(k == "unanswered" for k, _ in outcomes),
        "p95_over_contract_worst": max(ratios, default=float("nan")),
        "p95_over_contract_median": statistics.median(ratios) if ratios else float("nan"),
        "within_10pct": bool(ratios) and max(ratios) <= TARGET_RATIO,
        "late_sessions": sum(x > TARGET_RATIO for x in ratios),
        "unserved_sessions": len(unwatched),
        "unserved_untold": sum(not r["notices"] and not r["shed_in_status"] for r in unwatched),
        "told_sessions": sum(bool(r["notices"]) for r in per.values()),
        "busy_fraction_max": max(loads, default=0.0), "busy_fraction_limit": LIMIT,
        "over_capacity_s": over,
        "capacity_model": model, "capacity_model_by_device": found,
        "priced_vs_measured_by_host": pricing,
        "capacity_baseline": baseline["capacity"], "baseline_block_ms": baseline["block_ms"],
        "baseline_threads": baseline["threads"],
        "capacity_model_over_baseline": model / baseline["capacity"] if baseline["capacity"] else float("nan"),
        "host_p95_over_contract_worst": max(host_ratios, default=float("nan")),
        "host_p95_over_contract_median": statistics.median(host_ratios) if host_ratios else float("nan"),
        "playout_hold_p95_ms_worst": max(holds, default=float("nan")),
        "playout_hold_p95_ms_median": statistics.median(holds) if holds else float("nan"),
        "hosts": {h.host_id: {"machine": h.machine, "device": h.device, "sessions": h.sessions,
                              "busy_fraction": h.busy_fraction, "served_fraction": h.served_fraction,
                              "measured_fraction": h.measured_fraction,
                              "profile_ms": {r.tier: (r.quantum_ms, r.block_ms) for r in h.profile
                                             if r.backend == "world"}}
                  for h in hosts},
        "sessions": per,
    }


def summary(rounds: list[dict]) -> dict:
    """Rounds of one offered level: the median of each round's worst and median ratio, the worst round."""
    worst = [r["p95_over_contract_worst"] for r in rounds]
    return {
        "p95_over_contract_worst": max(worst), "p95_over_contract_worst_median": statistics.median(worst),
        "p95_over_contract_median": statistics.median(r["p95_over_contract_median"] for r in rounds),
        "host_p95_over_contract_worst": max(r["host_p95_over_contract_worst"] for r in rounds),
        "playout_hold_p95_ms_median": statistics.median(r["playout_hold_p95_ms_median"] for r in rounds),
        "playout_hold_p95_ms_worst": max(r["playout_hold_p95_ms_worst"] for r in rounds),
        "admitted": min(r["admitted"] for r in rounds),
        "within_10pct": all(r["within_10pct"] for r in rounds),
        "late_sessions_max": max(r["late_sessions"] for r in rounds),
        "unserved_sessions_max": max(r["unserved_sessions"] for r in rounds),
        "unserved_untold_max": max(r["unserved_untold"] for r in rounds),
        "busy_fraction_max": max(r["busy_fraction_max"] for r in rounds),
        "busy_within_limit": all(r["busy_fraction_max"] <= LIMIT + 0.05 for r in rounds),
        "over_capacity_s_max": max(r["over_capacity_s"] for r in rounds),
        "unanswered": sum(r["unanswered"] for r in rounds),
        "capacity_model_median": statistics.median(r["capacity_model"] for r in rounds),
        "capacity_baseline_median": statistics.median(r["capacity_baseline"] for r in rounds),
    }


async def found_capacity(args, tmp: Path) -> int:
    """The capacity model's count for the contract on a fresh stack (for --overload's levels)."""
    stack = UpStack(tmp / "probe", engines=args.engines).start()
    try:
        await stack.ready()
        nc = await bus.connect(stack.cli_url(), name="bench-c1-probe")
        hosts = await live_hosts(nc, args.engines)
        await nc.close()
    finally:
        stack.stop()
    return sum(carried(msgspec.convert(c1_contract(args.period_ms), Contract), "world", hosts, Guard()).values())


def main() -> None:
    p = common.parser("c1_periods", __doc__.splitlines()[0])
    p.add_argument("--engines", type=int, default=2)
    p.add_argument("--sessions", type=int, default=16)
    p.add_argument("--period-ms", type=float, default=67.0)
    p.add_argument("--seconds", type=float, default=None)
    p.add_argument("--settle-s", type=float, default=5.0)
    p.add_argument("--rounds", type=int, default=3, help="rounds per offered level (at least 3)")
    p.add_argument("--mix", action="store_true", help="C1 world, C2a avatar and C3 dit sessions together")
    p.add_argument("--overload", action="store_true", help="offer 1.0x, 1.4x and 2x the capacity found")
    args = p.parse_args()
    args.seconds = args.seconds or (10.0 if args.quick else 30.0)
    args.rounds = max(3, args.rounds)
    with tempfile.TemporaryDirectory() as tmp:
        cap = asyncio.run(found_capacity(args, Path(tmp))) if args.overload else 0
    levels = {f"{x:.1f}x": max(1, round(x * cap)) for x in OVERLOAD_LEVELS} if args.overload \
        else {"offered": args.sessions}
    rounds: dict[str, list[dict]] = {k: [] for k in levels}
    for i in range(args.rounds):  # interleaved: the machine's load drifts, every level sees the same drift
        for level, n in levels.items():
            print(f"round {i + 1}/{args.rounds}: {level} ({n} sessions)", flush=True)
            with tempfile.TemporaryDirectory() as tmp:
                rounds[level].append(asyncio.run(run(args, Path(tmp), n)))
    sums = {k: summary(v) for k, v in rounds.items()}
    first = next(iter(levels))
    res = {**rounds[first][-1], **sums[first]}  # the first level's numbers at the top level
    rows = []
    for level, s in sums.items():
        rows += [
            (f"[{level}] offered / admitted (fewest in a round)", f"{levels[level]} / {s['admitted']}", ""),
            (f"[{level}] p95 period / contract: worst round, median",
             f"{s['p95_over_contract_worst']:.3f}, {s['p95_over_contract_median']:.3f}",
             f"target <= {TARGET_RATIO}: {'met' if s['within_10pct'] else 'MISSED'}"),
            (f"[{level}] late sessions (most in a round), unanswered", f"{s['late_sessions_max']}, {s['unanswered']}",
             "target 0, 0"),
            (f"[{level}] admitted C1 not served while watched (most in a round), of them untold",
             f"{s['unserved_sessions_max']}, {s['unserved_untold_max']}", "shed or capacity_lost is told"),
            (f"[{level}] busy_fraction_max, over_capacity_s (worst round)",
             f"{s['busy_fraction_max']:.2f}, {s['over_capacity_s_max']:.1f}",
             f"target <= {LIMIT + 0.05:.2f}: {'met' if s['busy_within_limit'] else 'MISSED'}"),
            (f"[{level}] capacity: model, back-to-back baseline (medians)",
             f"{s['capacity_model_median']}, {s['capacity_baseline_median']}", "target within 15 %"),
        ]
    rows += [("refusal reasons (last round)", str(res["rejected_reasons"]), "")]
    common.table(rows)
    common.write(args.json, {"benchmark": "c1_periods", "quick": args.quick, "engines": args.engines,
                             "period_ms": args.period_ms, "seconds": args.seconds, "rounds": args.rounds,
                             "mix": args.mix, "overload": args.overload, "levels": levels, **res,
                             "by_level": sums, "rounds_by_level": rounds,
                             "target": {"p95_over_contract_max": TARGET_RATIO, "busy_fraction_max": LIMIT + 0.05,
                                        "late_sessions": 0, "unanswered": 0, "capacity_vs_baseline": 0.15}})


if __name__ == "__main__":
    main()
