"""Throughput and added latency of ingress → gateway → engine client, and how many sessions one fence holds.

    python -m bench.gateway [--quick] --json PATH

Runs a real nats-server and the fence service as its own process (`statefleet
serve fence`), with the engine-side client and the frontends (WebSockets) in
this process. Latency is one item at a time from just before the frontend sends
it to the moment the engine's lease yields it; the baseline is a bare NATS
publish → subscribe of the same payload, measured in the same run, and the
added latency is the difference of the percentiles. The floor, measured beside it, is what the
invariants cost an item from one process: its store and its release, each a compare-and-set append,
in order, to the release's delivery. Then it registers many
sessions through `sf.fence.register` and reads the fence process's RSS.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from bench.common import parser, percentile, progress, table, write
from libs import bus
from libs.fence import ownership, session_log
from libs.fence.client import EngineClient, Lease
from libs.natsd import NatsServer, free_port
from libs.schemas.fence import RegisterReply, RegisterRequest

PAYLOAD = b'{"kind": "action", "data": {"keys": ["w"], "mouse": [3, -1]}}'
TARGETS = {"added_ms_p99": "< 2", "items_per_s": ">= 5000", "sessions_registered": ">= 100000"}


def start_fence(nats_url: str, port: int) -> subprocess.Popen:
    env = {**os.environ, "SF_HTTP_PORT": str(port), "SF_LOG_LEVEL": "warning", "SF_INSTANCE_ID": "bench"}
    return subprocess.Popen([sys.executable, "-c", "from statefleet.cli import main; main()", "serve", "fence",
                             "--nats-url", nats_url],
                            env=env, stdin=subprocess.DEVNULL)


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def wait_http(port: int) -> None:
    async with aiohttp.ClientSession() as http:
        for _ in range(300):
            try:
                async with http.get(f"http://127.0.0.1:{port}/healthz") as resp:
                    if resp.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    raise RuntimeError("fence did not come up")


async def baseline(nc, n: int) -> list[float]:
    """Bare NATS publish → subscribe of the same payload, one at a time."""
    got: asyncio.Queue[float] = asyncio.Queue()

    async def on_msg(_):
        got.put_nowait(time.perf_counter())

    sub = await nc.subscribe("bench.baseline", cb=on_msg)
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        await nc.publish("bench.baseline", PAYLOAD)
        out.append((await got.get() - t0) * 1000)
    await sub.unsubscribe()
    return out


async def cas_appends_per_s(nc, writers: int, per_writer: int) -> float:
    """The floor under every release: bare JetStream compare-and-set appends, `writers` sessions each
    appending in turn with the headers a release carries (last sequence of the session's whole log)."""
    js = nc.jetstream()
    await bus.ensure_stream(js, bus.StreamSpec("BENCH_CAS", ["bench.cas.>"]))

    async def writer(i: int) -> None:
        last = 0
        for _ in range(per_writer):
            ack = await js.publish(f"bench.cas.{i}.h", PAYLOAD, headers={
                session_log.EXPECTED_LAST_SUBJECT_SEQ: str(last),
                session_log.EXPECTED_LAST_SUBJECT_SEQ_SUBJECT: f"bench.cas.{i}.>"})
            last = ack.seq

    start = time.perf_counter()
    await asyncio.gather(*(writer(i) for i in range(writers)))
    elapsed = time.perf_counter() - start
    await js.delete_stream("BENCH_CAS")
    return writers * per_writer / elapsed


async def floor(nc, n: int) -> list[float]:
    """What every item pays at least, one at a time, from this one process: its store (a CAS append on the
    item's subject), then its release (a CAS append on the session's whole log, the headers a release
    carries), until an ordered consumer (as an engine host's feed is) delivers the release. The path
    measured by `latency` adds the fence process between the frontend and each append."""
    js = nc.jetstream()
    await bus.ensure_stream(js, bus.StreamSpec("BENCH_FLOOR", ["bench.floor.>"]))
    got: asyncio.Queue[float] = asyncio.Queue()

    async def on_msg(msg) -> None:
        got.put_nowait(time.perf_counter())

    sub = await js.subscribe("bench.floor.log.>", cb=on_msg, ordered_consumer=True, stream="BENCH_FLOOR")
    store = release = 0
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        store = (await js.publish("bench.floor.input", PAYLOAD, headers={
            session_log.EXPECTED_LAST_SUBJECT_SEQ: str(store)})).seq
        release = (await js.publish("bench.floor.log.h", PAYLOAD, headers={
            session_log.EXPECTED_LAST_SUBJECT_SEQ: str(release),
            session_log.EXPECTED_LAST_SUBJECT_SEQ_SUBJECT: "bench.floor.log.>"})).seq
        out.append((await got.get() - t0) * 1000)
    await sub.unsubscribe()
    await js.delete_stream("BENCH_FLOOR")
    return out


async def setup_sessions(nc, client: EngineClient, n: int) -> tuple[dict[str, str], dict[str, Lease]]:
    tokens, leases = {}, {}
    for i in range(n):
        sid = f"b{i}"
        reply = await bus.request(nc, "sf.fence.register", RegisterRequest(session_id=sid, backend="bench", seed=i),
                                  RegisterReply)
        tokens[sid] = reply.token
        a = await ownership.assign(nc, sid, client.server_id)
        leases[sid] = await client.claim(sid, a.version, 0)
    return tokens, leases


async def latency(port: int, token: str, lease: Lease, n: int) -> list[float]:
    url = f"http://127.0.0.1:{port}/v1/sessions/{lease.session_id}/ws"
    items = lease.__aiter__()
    out = []
    async with aiohttp.ClientSession() as http, http.ws_connect(url, headers={"Authorization": f"Bearer {token}"}) as ws:
        for _ in progress(range(n), n, "latency"):
            t0 = time.perf_counter()
            await ws.send_bytes(PAYLOAD)
            item = await anext(items)
            out.append((time.perf_counter() - t0) * 1000)
            # Caught up: report, as an engine host does. Fence releases at most max_unapplied_items past
            # the reported cursor; an engine that never reports has every 256th item held for up to a
            # second (the held sessions' retry), which is backpressure, not the path's latency.
            await lease.report_applied(item.seq)
            await ws.receive_json()
    return out


async def throughput(port: int, tokens: dict[str, str], leases: dict[str, Lease], per_session: int,
                     window: int) -> float:
    """Every session streams `per_session` items over its WebSocket with `window` unacknowledged."""

    async def frontend(http, sid: str) -> None:
        url = f"http://127.0.0.1:{port}/v1/sessions/{sid}/ws"
        async with http.ws_connect(url, headers={"Authorization": f"Bearer {tokens[sid]}"}) as ws:
            credit = asyncio.Semaphore(window)

            async def acks():
                for _ in range(per_session):
                    assert "seq" in await ws.receive_json()
                    credit.release()

            reader = asyncio.create_task(acks())
            for _ in range(per_session):
                await credit.acquire()
                await ws.send_bytes(PAYLOAD)
            await reader

    async def engine(lease: Lease) -> None:
        items = lease.__aiter__()
        for _ in range(per_session):
            item = await anext(items)
            if lease.backlog == 0:  # caught up: report, as an engine host does (fence bounds what it releases)
                await lease.report_applied(item.seq)

    start = time.perf_counter()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        await asyncio.gather(*(frontend(http, sid) for sid in tokens), *(engine(le) for le in leases.values()))
    return per_session * len(tokens) / (time.perf_counter() - start)


async def register_many(nc, n: int, concurrency: int = 256) -> int:
    done = 0
    ids = iter(progress(range(n), n, "register"))

    async def worker():
        nonlocal done
        for i in ids:
            await bus.request(nc, "sf.fence.register", RegisterRequest(session_id=f"r{i}", backend="bench", seed=i),
                              RegisterReply, timeout_s=30)
            done += 1

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return done


async def run(quick: bool) -> dict:
    n_lat = 300 if quick else 2000
    sessions, per_session = (20, 100) if quick else (50, 400)
    n_register = 5_000 if quick else 100_000
    with tempfile.TemporaryDirectory() as tmp:
        server = NatsServer(store_dir=Path(tmp) / "nats").start()
        port = free_port()
        fence = start_fence(server.url, port)
        try:
            await wait_http(port)
            nc = await bus.connect(server.url, name="bench")
            client = EngineClient(nc, nc.jetstream(), "bench-engine")
            await client.start()
            tokens, leases = await setup_sessions(nc, client, sessions)
            base = await baseline(nc, n_lat)
            floor_ms = await floor(nc, n_lat)
            lat = await latency(port, tokens["b0"], leases["b0"], n_lat)
            items_per_s = await throughput(port, tokens, leases, per_session, window=16)
            cas_rate = await cas_appends_per_s(nc, sessions, per_session)
            registered = await register_many(nc, n_register)
            rss = rss_mib(fence.pid)
            await client.close()
            await nc.close()
        finally:
            fence.terminate()
            fence.wait(10)
            server.stop()
    return {
        "items_per_s": items_per_s,
        # the floor, same run: one release is one such append (the input store is another)
        "cas_appends_per_s": cas_rate,
        "added_ms_p50": percentile(lat, 50) - percentile(base, 50),
        "added_ms_p99": percentile(lat, 99) - percentile(base, 99),
        "e2e_ms_p50": percentile(lat, 50),
        "e2e_ms_p99": percentile(lat, 99),
        # the invariants' floor, same run: an item's store and its release, CAS'd in order, to delivery
        "floor_ms_p50": percentile(floor_ms, 50),
        "floor_ms_p99": percentile(floor_ms, 99),
        "added_over_floor_ms_p99": percentile(lat, 99) - percentile(floor_ms, 99),
        "baseline_ms_p50": percentile(base, 50),
        "baseline_ms_p99": percentile(base, 99),
        "sessions_registered": registered,
        "rss_mib": rss,
        "config": {"latency_items": n_lat, "throughput_sessions": sessions, "items_per_session": per_session,
                   "window": 16, "transport": "websocket"},
        "targets": TARGETS,
    }


def main() -> None:
    args = parser("gateway", __doc__.splitlines()[0]).parse_args()
    result = asyncio.run(run(args.quick))
    table([
        ("items_per_s", result["items_per_s"], "target >= 5000 on 2 cores"),
        ("cas_appends_per_s", result["cas_appends_per_s"], "bare JetStream CAS appends, same sessions"),
        ("added_ms_p50", result["added_ms_p50"], f"e2e {result['e2e_ms_p50']:.3f} ms"),
        ("added_ms_p99", result["added_ms_p99"], "target < 2 ms"),
        ("baseline_ms_p99", result["baseline_ms_p99"], "bare NATS pub → sub"),
        ("floor_ms_p99", result["floor_ms_p99"], "store CAS, release CAS, delivery; no fence"),
        ("added_over_floor_ms_p99", result["added_over_floor_ms_p99"], "e2e p99 less the floor's p99"),
        ("sessions_registered", result["sessions_registered"], "target 100000"),
        ("rss_mib", result["rss_mib"], "fence process after registering"),
    ])
    write(args.json, result)


if __name__ == "__main__":
    main()
