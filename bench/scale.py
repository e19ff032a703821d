"""Many concurrently served sessions on one fence: the server's consumers, memory and release latency.

    python -m bench.scale [--quick] --json PATH

A real nats-server (file storage) and a real fence service (its own process). H simulated engine hosts — each an
`EngineClient` on its own connection, the engine side of fencing without a model — claim N
sessions between them (10,000; 1,000 with --quick) through `sf.fence.claim` and keep every lease
open, taking each item as a host's input loop would. Input then goes through fence's ingress
(HTTP POST with the session's token) to a random sample of sessions, round after round, and each
item is timed from its POST to its lease yielding it (the release latency an engine sees).

Measured: the server's consumer count (every stream) and nats-server's resident memory with no
session and with all N served, the release latency p50/p99, and that every item arrived exactly
once and in order. Baseline in the same run: the design this replaced, one ordered consumer per
lease on the session's log (same filter, start and 1 s heartbeat the old lease used), opened on
each host's connection for B of the sessions (2,000; 1,000 with --quick: more saturates this one
client process) on the same server; the same kind of rounds, over those B sessions, are timed on
those consumers and on the host feeds beside them. That
design needs the session stream's consumer limit raised first: nats-server >= 2.15 gives every
stream a default limit of 1000 consumers (`settings.session_stream_max_consumers`), so as shipped
it could not serve more than about 1000 sessions at all.
"""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import aiohttp

from bench.common import parser, percentile, table, write
from libs import bus, errors, logs, names
from libs.fence import ownership
from libs.fence.client import EngineClient, Lease
from libs.natsd import NatsServer, free_port
from libs.procs import die_with_parent
from libs.schemas.base import decode
from libs.schemas.fence import LogRecord, MetaRequest, RegisterReply, RegisterRequest, Release, SessionMeta

CONCURRENCY = 32  # requests in flight while sessions are set up
IN_FLIGHT = 8  # items posted at once while latency is measured (a burst would time ingress's queue)
PER_LEASE_HEARTBEAT_S = 1.0  # what the per-lease consumer used


def pct(values: list[float], q: float) -> float | None:
    """A percentile, or None (valid JSON) when there was nothing to measure (a failed baseline)."""
    return percentile(values, q) if values else None


def shown(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3g}"


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def consumers(js) -> int:
    return (await js.account_info()).consumers


def start_fence(url: str, http_port: int) -> subprocess.Popen:
    """The fence service in its own process, as `statefleet up` runs it."""
    env = {**os.environ, "SF_HTTP_PORT": str(http_port), "SF_LOG_LEVEL": "warning", "SF_INSTANCE_ID": "fence-scale"}
    return subprocess.Popen([sys.executable, "-m", "statefleet", "serve", "fence", "--nats-url", url], env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, preexec_fn=die_with_parent)


async def fence_ready(nc, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            await bus.request(nc, names.FENCE_META, MetaRequest(session_id="ready"), SessionMeta, timeout_s=1.0)
        except errors.NotFound:
            return
        except errors.StatefleetError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def raise_consumer_limit(js, limit: int) -> int:
    """Let the session stream hold `limit` consumers; returns the limit it had. nats-server >= 2.15
    gives every stream a default of 1000 consumers, so the per-lease design cannot serve more than
    about 1000 sessions without this; the host feed needs one per engine host."""
    config = (await js.stream_info(names.SESSION_STREAM)).config
    before = config.max_consumers
    config.max_consumers = limit
    await js.update_stream(config)
    return before


async def bounded(coros, limit: int, label: str) -> list:
    """Run `coros` with at most `limit` in flight, printing progress."""
    sem = asyncio.Semaphore(limit)
    done = 0
    start = time.monotonic()

    async def one(c):
        nonlocal done
        async with sem:
            result = await c
        done += 1
        if done % 500 == 0 or done == len(coros):
            print(f"\r{label}: {done}/{len(coros)} ({done / (time.monotonic() - start):,.0f}/s)", end="",
                  file=sys.stderr)
        return result

    out = await asyncio.gather(*(one(c) for c in coros))
    print(file=sys.stderr)
    return out


class Fleet:
    """The simulated hosts: every lease's items, with arrival times."""

    def __init__(self) -> None:
        self.arrived: dict[tuple[str, int], float] = {}
        self.seqs: defaultdict[str, list[int]] = defaultdict(list)
        self.tasks: list[asyncio.Task] = []

    def serve(self, lease: Lease) -> None:
        self.tasks.append(asyncio.create_task(self._take(lease)))

    async def _take(self, lease: Lease) -> None:
        async for item in lease:
            self.arrived[(item.session_id, item.seq)] = time.perf_counter()
            self.seqs[item.session_id].append(item.seq)


class PerLease:
    """The replaced design's consumers: one ordered consumer per lease on its session's log."""

    def __init__(self) -> None:
        self.arrived: dict[tuple[str, int], float] = {}
        self.subs: list = []

    async def open(self, js, sid: str, owner) -> None:
        async def on_record(msg) -> None:
            event = decode(msg.data, LogRecord).event
            if isinstance(event, Release) and (event.server_id, event.version) == owner:
                for item in event.items:
                    self.arrived[(sid, item.seq)] = time.perf_counter()

        config = bus.ConsumerConfig(deliver_policy=bus.DeliverPolicy.NEW)
        self.subs.append(await js.subscribe(names.session_log_subject(sid), cb=on_record, ordered_consumer=True,
                                            config=config, stream=names.SESSION_STREAM,
                                            idle_heartbeat=PER_LEASE_HEARTBEAT_S))


async def post(http, port: int, sid: str, token: str, text: str) -> tuple[int, float]:
    """POST one item through ingress; its seq and when it was sent."""
    t0 = time.perf_counter()
    async with http.post(f"http://127.0.0.1:{port}/v1/sessions/{sid}/items", json={"kind": "text", "data": text},
                         headers={"Authorization": f"Bearer {token}"}) as resp:
        body = await resp.json()
    assert resp.status == 200, body
    return body["seq"], t0


async def post_rounds(http, port: int, tokens: dict[str, str], next_seq: dict[str, int],
                      arrivals: list[dict], rounds: int, per_round: int, label: str) -> list[list[float]]:
    """Post one item to each of `per_round` random sessions per round, `IN_FLIGHT` at a time; for each
    map in `arrivals` (where the items are seen arriving), the latencies from POST to arrival."""
    latencies: list[list[float]] = [[] for _ in arrivals]
    rng = random.Random(label)
    gate = asyncio.Semaphore(IN_FLIGHT)

    async def one(sid: str, text: str) -> tuple[int, float]:
        async with gate:
            return await post(http, port, sid, tokens[sid], text)

    for r in range(rounds):
        picked = rng.sample(sorted(tokens), per_round)
        results = await asyncio.gather(*(one(sid, f"{label} {r}") for sid in picked))
        sent = {(sid, seq): t0 for sid, (seq, t0) in zip(picked, results, strict=True)}
        next_seq.update({sid: seq for sid, seq in sent})
        for _ in range(6000):  # 30 s at most
            if all(key in arrived for arrived in arrivals for key in sent):
                break
            await asyncio.sleep(0.005)
        for out, arrived in zip(latencies, arrivals, strict=True):
            out += [(arrived[k] - t0) * 1e3 for k, t0 in sent.items() if k in arrived]
        print(f"\r{label}: round {r + 1}/{rounds}", end="", file=sys.stderr)
        await asyncio.sleep(0.2)
    print(file=sys.stderr)
    return latencies


async def run(quick: bool) -> dict:
    n_sessions, n_hosts = (1_000, 10) if quick else (10_000, 20)
    rounds, per_round = (5, 100) if quick else (10, 300)
    # Past ~2000 per-lease consumers in this one process (1 s heartbeats each) the client side, not the
    # server, saturates a 2-core machine: consumer creations time out and the run measures that.
    n_baseline = 1_000 if quick else 2_000
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
        server = NatsServer(store_dir=Path(tmp) / "nats").start()
        fence_port = free_port()
        fence = start_fence(server.url, fence_port)
        nc = await bus.connect(server.url, name="bench-scale")
        js = nc.jetstream()
        await fence_ready(nc)
        hosts = [f"h{i}" for i in range(n_hosts)]
        clients = {}
        for h in hosts:
            hnc = await bus.connect(server.url, name=f"bench-scale-{h}")
            clients[h] = EngineClient(hnc, hnc.jetstream(), h)
            await clients[h].start()
        fleet, per_lease = Fleet(), PerLease()
        try:
            await asyncio.sleep(1.0)
            idle = {"consumers": await consumers(js), "rss": rss_mib(server.proc.pid)}
            sids = [f"s{i:05d}" for i in range(n_sessions)]
            t0 = time.perf_counter()

            async def register(sid: str) -> tuple[str, str]:
                reply = await bus.request(nc, names.FENCE_REGISTER,
                                          RegisterRequest(session_id=sid, backend="toy", seed=1), RegisterReply)
                return sid, reply.token

            tokens = dict(await bounded([register(s) for s in sids], CONCURRENCY, "register"))

            async def serve(i: int, sid: str):
                host = hosts[i % n_hosts]
                a = await ownership.assign(nc, sid, host)
                lease = await clients[host].claim(sid, a.version, cursor=0)
                fleet.serve(lease)
                return sid, (host, a.version)

            owners = dict(await bounded([serve(i, s) for i, s in enumerate(sids)], CONCURRENCY, "assign+claim"))
            setup_s = time.perf_counter() - t0
            await asyncio.sleep(2.0)
            served = {"consumers": await consumers(js), "rss": rss_mib(server.proc.pid)}
            next_seq: dict[str, int] = {}
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=per_round)) as http:
                [feed_ms] = await post_rounds(http, fence_port, tokens, next_seq, [fleet.arrived], rounds,
                                              per_round, "host feed")
                # The replaced design, on the first `n_baseline` sessions, each consumer on its host's connection.
                base = sids[:n_baseline]
                stream_limit = await raise_consumer_limit(js, n_baseline + 1000)
                try:
                    await bounded([per_lease.open(clients[owners[sid][0]].js, sid, owners[sid]) for sid in base],
                                  CONCURRENCY, "per-lease consumers")
                    await asyncio.sleep(2.0)
                    baseline = {"consumers": await consumers(js), "rss": rss_mib(server.proc.pid), "error": ""}
                    # The same items timed on both paths: the per-lease consumers and the host feeds beside them.
                    lease_ms, feed_beside_ms = await post_rounds(http, fence_port, {s: tokens[s] for s in base},
                                                                 next_seq, [per_lease.arrived, fleet.arrived], rounds,
                                                                 per_round, "per-lease")
                except Exception as e:  # the design under comparison failing is a result, not a crash
                    baseline = {"consumers": len(per_lease.subs), "rss": rss_mib(server.proc.pid),
                                "error": repr(e)[:300]}
                    lease_ms, feed_beside_ms = [], []
            await asyncio.sleep(1.0)
            expected = {sid: list(range(1, seq + 1)) for sid, seq in next_seq.items()}
            got = {sid: fleet.seqs.get(sid, []) for sid in expected}
            lost = sum(len(set(expected[s]) - set(got[s])) for s in expected)
            misordered = sum(got[s] != sorted(set(got[s])) for s in expected)
            stray = sum(1 for s in fleet.seqs if s not in expected)
        finally:
            for sub in per_lease.subs:
                await sub.unsubscribe()
            for c in clients.values():
                await c.close()
                await c.nc.close()
            for t in fleet.tasks:
                t.cancel()
            await nc.close()
            fence.terminate()
            fence.wait(30)
            server.stop()
    items = sum(len(v) for v in expected.values())
    return {
        "sessions_served": n_sessions, "engine_hosts": n_hosts,
        "server_consumers_idle": idle["consumers"], "server_consumers": served["consumers"],
        "per_lease_baseline_sessions": n_baseline,
        "server_consumers_per_lease_baseline": baseline["consumers"],
        "per_lease_baseline_error": baseline["error"],
        "nats_rss_mib_idle": idle["rss"], "nats_rss_mib": served["rss"],
        "nats_rss_mib_per_lease_baseline": baseline["rss"],
        "nats_rss_kib_per_served_session": (served["rss"] - idle["rss"]) * 1024 / n_sessions,
        "nats_rss_kib_per_lease_consumer": (baseline["rss"] - served["rss"]) * 1024 / max(1, baseline["consumers"]
                                                                                         - served["consumers"]),
        "release_latency_ms_p50": pct(feed_ms, 50), "release_latency_ms_p99": pct(feed_ms, 99),
        "per_lease_release_latency_ms_p50": pct(lease_ms, 50),
        "per_lease_release_latency_ms_p99": pct(lease_ms, 99),
        # Host feeds timed on the same items as the per-lease consumers, while those were open too.
        "host_feed_beside_per_lease_latency_ms_p50": pct(feed_beside_ms, 50),
        "host_feed_beside_per_lease_latency_ms_p99": pct(feed_beside_ms, 99),
        "items_posted": items, "items_lost": lost, "sessions_misordered_or_duplicated": misordered,
        "sessions_with_stray_items": stray, "setup_s": setup_s, "sessions_set_up_per_s": n_sessions / setup_s,
        "settings": {"rounds": rounds, "items_per_round": per_round, "per_lease_heartbeat_s": PER_LEASE_HEARTBEAT_S,
                     "storage": "file", "session_stream_max_consumers": stream_limit,
                     "per_lease_baseline_needed_max_consumers": n_baseline + 1000},
        "targets": {"server_consumers": "independent of sessions_served (one per engine host)",
                    "items_lost": 0, "sessions_misordered_or_duplicated": 0},
    }


def main() -> None:
    args = parser("scale", __doc__.splitlines()[0]).parse_args()
    logs.setup("warning", json=False)
    r = asyncio.run(run(args.quick))
    table([("sessions_served", r["sessions_served"], f"on {r['engine_hosts']} engine hosts"),
           ("server_consumers", r["server_consumers"], f"idle {r['server_consumers_idle']}; plus per-lease "
                                                       f"consumers for {r['per_lease_baseline_sessions']}: "
                                                       f"{r['server_consumers_per_lease_baseline']}"),
           ("nats_rss_mib", r["nats_rss_mib"], f"idle {r['nats_rss_mib_idle']:.0f}; plus per-lease consumers "
                                               f"{r['nats_rss_mib_per_lease_baseline']:.0f}"),
           ("nats_rss_kib_per_lease_consumer", r["nats_rss_kib_per_lease_consumer"],
            f"vs {r['nats_rss_kib_per_served_session']:.3g} KiB per served session with host feeds"),
           ("release_latency_ms_p50", r["release_latency_ms_p50"],
            f"per-lease design {shown(r['per_lease_release_latency_ms_p50'])}"),
           ("release_latency_ms_p99", r["release_latency_ms_p99"],
            f"per-lease design {shown(r['per_lease_release_latency_ms_p99'])}"),
           ("host_feed_beside_per_lease_latency_ms_p50", r["host_feed_beside_per_lease_latency_ms_p50"],
            "the same items as the per-lease row"),
           ("items_lost", r["items_lost"], f"of {r['items_posted']}; target 0"),
           ("sessions_misordered_or_duplicated", r["sessions_misordered_or_duplicated"], "target 0"),
           ("sessions_set_up_per_s", r["sessions_set_up_per_s"], "register + assign + claim")])
    write(args.json, r)


if __name__ == "__main__":
    main()
