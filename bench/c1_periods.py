"""Admitted C1 sessions keep their period under `statefleet up`: p95 block period against the contract.

    python -m bench.c1_periods [--quick] [--sessions N] [--period-ms MS] [--seconds S] --json PATH

A fresh stack (`statefleet up`: embedded NATS, every service, `--engines` CPU engine hosts on this
machine, which share its cores) is offered `--sessions` C1 world sessions at once, each at a
`--period-ms` period with the backend's lowest tier as its quality floor. A session placed (201,
or 202 and placed within the queue timeout) is watched for `--seconds`: the period of a block is
the time between the arrival of its first chunk and the previous block's, at the client. A
refused one is counted with its reason.

Per admitted session: `p95_period_ms` and `p95_over_contract`; over them: the worst and the median
ratio, and whether every one is within 10 % of its contract (the issue's acceptance); the same
ratio as the host measured it when it published (`host_p95_*`: before the bus and this client,
which share the machine's cores with the stack), with each session's tier and skipped blocks. Per engine
host, from its last heartbeat: `busy_fraction` (what admission budgets: every session at its floor,
at the costs serving learned) and `served_fraction` (at the tiers served now, which the host keeps
within the budget by stepping sessions down its ladder).
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import aiohttp

from bench import common
from bench.frontend import SessionClient, c1_contract
from bench.load import ENV, live_hosts, offer
from bench.stack import UpStack
from libs import bus, names
from libs.schemas.engine import OutputChunk
from statefleet.engines import host_statuses

TARGET_RATIO = 1.10  # p95 period within 10 % of the contract


def periods_ms(c: SessionClient, start: float, end: float) -> list[float]:
    live = [a for a in c.live_blocks() if start <= a.at < end]
    return [(b.at - a.at) * 1000 for a, b in zip(live, live[1:], strict=False)]


def p95(xs: list[float]) -> float:
    return sorted(xs)[min(len(xs) - 1, int(0.95 * (len(xs) - 1) + 0.5))] if xs else float("nan")


async def run(args, tmp: Path) -> dict:
    stack = UpStack(tmp / "stack", engines=args.engines, env=ENV).start()
    try:
        await stack.ready()
        nc = await bus.connect(stack.cli_url(), name="bench-c1-periods")
        await live_hosts(nc, args.engines)
        contract = c1_contract(args.period_ms)
        async with aiohttp.ClientSession(headers=stack.admin_headers()) as http:
            outcomes = await asyncio.gather(*(offer(nc, http, stack.admission_url, contract, i + 1, backend="world")
                                              for i in range(args.sessions)))
            clients = []
            for kind, body in outcomes:
                if kind == "admitted":
                    c = SessionClient(sid=body["session_id"], token=body["input_token"], input_url=body["input_url"],
                                      host_id=body.get("host_id", ""), period_s=body["contract"]["period_ms"] / 1000)
                    await bus.subscribe_events(nc, names.output_subject(c.sid), OutputChunk, c.on_chunk)
                    clients.append(c)
            start = time.monotonic() + args.settle_s  # past start-up and the first step-downs
            for t in common.progress(range(int(args.settle_s + args.seconds)), int(args.settle_s + args.seconds),
                                     "watching"):
                del t
                await asyncio.sleep(1.0)
            end = time.monotonic()
        hosts = await live_hosts(nc, args.engines)
        statuses = [st for st in await host_statuses(stack.cli_url()) if not isinstance(st, str)]
        await nc.close()
    finally:
        stack.stop()
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
                  "skipped_blocks": m.skipped_blocks}
    ratios = [r["p95_over_contract"] for r in per.values()]
    host_ratios = [r["host_p95_period_ms"] / r["contract_ms"] for r in per.values() if "host_p95_period_ms" in r]
    reasons: dict[str, int] = {}
    for kind, body in outcomes:
        if kind == "rejected":
            r = body.get("reason") or (body.get("verdict") or {}).get("reason") or body.get("code") or "?"
            reasons[r] = reasons.get(r, 0) + 1
    return {
        "offered": args.sessions, "admitted": len(clients),
        "rejected_explicitly": sum(k == "rejected" for k, _ in outcomes), "rejected_reasons": reasons,
        "unanswered": sum(k == "unanswered" for k, _ in outcomes),
        "p95_over_contract_worst": max(ratios, default=float("nan")),
        "p95_over_contract_median": statistics.median(ratios) if ratios else float("nan"),
        "within_10pct": bool(ratios) and max(ratios) <= TARGET_RATIO,
        "host_p95_over_contract_worst": max(host_ratios, default=float("nan")),
        "host_p95_over_contract_median": statistics.median(host_ratios) if host_ratios else float("nan"),
        "hosts": {h.host_id: {"machine": h.machine, "device": h.device, "sessions": h.sessions,
                              "busy_fraction": h.busy_fraction, "served_fraction": h.served_fraction}
                  for h in hosts},
        "sessions": per,
    }


def main() -> None:
    p = common.parser("c1_periods", __doc__.splitlines()[0])
    p.add_argument("--engines", type=int, default=2)
    p.add_argument("--sessions", type=int, default=16)
    p.add_argument("--period-ms", type=float, default=67.0)
    p.add_argument("--seconds", type=float, default=None)
    p.add_argument("--settle-s", type=float, default=5.0)
    args = p.parse_args()
    args.seconds = args.seconds or (10.0 if args.quick else 30.0)
    with tempfile.TemporaryDirectory() as tmp:
        res = asyncio.run(run(args, Path(tmp)))
    common.table([
        ("offered / admitted / refused / unanswered",
         f"{res['offered']} / {res['admitted']} / {res['rejected_explicitly']} / {res['unanswered']}", ""),
        ("refusal reasons", str(res["rejected_reasons"]), ""),
        ("p95 period / contract: worst, median",
         f"{res['p95_over_contract_worst']:.3f}, {res['p95_over_contract_median']:.3f}",
         f"target <= {TARGET_RATIO}: {'met' if res['within_10pct'] else 'MISSED'}"),
        ("same, at the host (at publish): worst, median",
         f"{res['host_p95_over_contract_worst']:.3f}, {res['host_p95_over_contract_median']:.3f}", ""),
        *((f"host {h}", f"busy {v['busy_fraction']:.2f} served {v['served_fraction']:.2f}, {v['sessions']} sessions",
           "") for h, v in res["hosts"].items()),
    ])
    common.write(args.json, {"benchmark": "c1_periods", "quick": args.quick, "engines": args.engines,
                             "period_ms": args.period_ms, "seconds": args.seconds, **res,
                             "target": {"p95_over_contract_max": TARGET_RATIO}})


if __name__ == "__main__":
    main()
