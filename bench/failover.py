"""Host failover on a real stack: SIGKILL the engine host that owns sessions under steady input, K times.

    python -m bench.failover [--quick] [--hog N] [--logs DIR] --json PATH

The stack: an embedded nats-server, fence, two placement instances and the mover (each a
service in this process, on the bus like any other), and engine hosts as their own processes
(`statefleet serve engine_host`, default heartbeat and expiry). Every session is an avatar C1
session fed one text item every `INPUT_PERIOD_S` through fence's ingress. Each round picks the
host owning the most sessions, SIGKILLs it and restarts it at once under the same host id (what
`statefleet up`'s supervisor does), and waits until every session it owned is claimed again.

Measured per affected session and kill:
- reclaim_s: SIGKILL → the replacement's claim record in fence's log (its `at`, same clock);
- first_output_after_kill_s: SIGKILL → the first output chunk of a block the replacement ran.
At the end, input stops and every session's final owner must have folded in every accepted item:
lost_inputs counts accepted items its state never reflected; inputs_applied_twice counts items its
state reflects more than once (the engine refuses gaps and duplicates, so cursors tell both).
replay_bit_identical compares every block index published twice (by the dead host and again by its
replacement, which restores the checkpoint and regenerates the journalled blocks after it with the
items and tier each recorded) byte for byte; true when none differs (None when none was published twice).

`--hog N` runs N load processes beside the stack for the whole run, each `python -m bench.load
--quick` over and over: a second whole stack (its own nats-server, services, engine hosts and
frontends) taking CPU, memory, disk and a bus of its own, which is what reproduced the differing
replays and the stalled input (docs/reliability.md, "Exact under load"); busy-loops did not.
A kill whose sessions are not reclaimed within 60 s, or show no output within 30 s of their claim,
is counted (`unreclaimed`, `no_output_after_claim`) rather than ending the run. `heartbeats` (and
every sample in `heartbeat_samples`) is what the hosts' heartbeats priced the shared device at beside
what their stages measured, each second (bench/heartbeat_trace.py): a run whose failovers wait `busy`
shows whether the device was full or its prices overstated it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import aiohttp
import msgspec

from bench.common import parser, percentile, table, write
from bench.heartbeat_trace import HeartbeatTrace
from bench.stack import answers
from libs import bus, errors, logs, names
from libs.contracts import Contract, Guard
from libs.fence.ownership import assign, read_owner
from libs.natsd import NatsServer
from libs.procs import die_with_parent
from libs.schemas.base import decode
from libs.schemas.common import EngineEntry, SessionSummary
from libs.schemas.engine import OutputChunk, SessionInfo, SessionRef
from libs.schemas.fence import Assign, Claim, LogRecord, RegisterReply, RegisterRequest
from libs.schemas.placement import Placement, PlaceRequest
from services.engine_host.service import EngineHostConfig
from services.fence.service import FenceConfig, FenceService
from services.mover.service import MoverConfig, MoverService
from services.placement.service import PlacementConfig, PlacementService

CONTRACT = Contract(session_class="C1", quality_floor=1, determinism="T0", period_ms=200.0)
INPUT_PERIOD_S = 0.2
TARGET_RECLAIM_P99_S = 3.0
TARGET_RECLAIM_P99_HOG_S = 5.0
ENGINE_DEFAULTS = EngineHostConfig()  # the engine hosts run with these (the bench sets none of them)


class Hog:
    """`n` processes of `python -m bench.load --quick`, each restarted when it ends, until `stop`."""

    def __init__(self, n: int, tmp: Path) -> None:
        self.n, self.tmp = n, tmp
        self.procs: dict[int, asyncio.subprocess.Process] = {}
        self.runs = 0
        self._tasks: list[asyncio.Task] = []
        self._logs: list = []

    def start(self) -> None:
        self._logs = [open(self.tmp / f"hog{i}.log", "ab") for i in range(self.n)]  # noqa: SIM115 (closed in stop)
        self._tasks = [asyncio.create_task(self._keep(i)) for i in range(self.n)]

    async def _keep(self, i: int) -> None:
        while True:
            self.runs += 1
            self.procs[i] = p = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "bench.load", "--quick", "--json", str(self.tmp / f"hog{i}.json"),
                stdout=self._logs[i], stderr=self._logs[i], stdin=subprocess.DEVNULL, preexec_fn=die_with_parent)
            await p.wait()

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for p in self.procs.values():  # its `statefleet up` dies with it (die_with_parent), and that stack's with it
            if p.returncode is None:
                p.terminate()
                try:
                    await asyncio.wait_for(p.wait(), 30)
                except TimeoutError:
                    p.kill()
                    await p.wait()
        for f in self._logs:
            f.close()


class Engine:
    def __init__(self, url: str, host_id: str, tmp: Path, hosts_on_machine: int) -> None:
        self.url, self.host_id, self.tmp = url, host_id, tmp
        self.hosts_on_machine = hosts_on_machine
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        # What `statefleet up`'s supervisor gives an engine host, and nothing more: every other
        # setting (heartbeat, checkpoint period, profile, torch threads) is the host's default. Like `up`, it
        # says how many hosts share the machine's cores (each takes its share of torch threads): without it
        # each of three hosts ran a team of every core, and on a loaded 2-core machine their start-up
        # profiles took minutes (docs/reliability.md).
        env = {**os.environ, "SF_NATS_URL": self.url, "SF_HOST_ID": self.host_id, "SF_INSTANCE_ID": self.host_id,
               "SF_CHECKPOINT_DIR": str(self.tmp / "ckpt"), "SF_LOG_JSON": "true",
               "SF_HOSTS_ON_MACHINE": str(self.hosts_on_machine)}
        with open(self.tmp / f"{self.host_id}.log", "ab") as log:
            # die_with_parent: a bench stopped by a time limit leaves no engine host behind
            self.proc = subprocess.Popen([sys.executable, "-m", "statefleet", "serve", "engine_host"], env=env,
                                         stdout=log, stderr=log, stdin=subprocess.DEVNULL, preexec_fn=die_with_parent)

    def kill(self) -> float:
        at = time.time()
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        return at


class Bench:
    def __init__(self, url: str, tmp: Path, hosts: int, sessions: int) -> None:
        self.url, self.tmp = url, tmp
        self.engines = {f"e{i}": Engine(url, f"e{i}", tmp, hosts) for i in range(hosts)}
        self.sids = [f"s{i}" for i in range(sessions)]
        self.tokens: dict[str, str] = {}
        self.accepted: dict[str, int] = defaultdict(int)
        self.blocks: dict[tuple[str, int], dict[str, str]] = {}  # (sid, block) → {emitter run: digest}
        self.chunk_times: dict[str, list[tuple[float, int]]] = defaultdict(list)
        self._parts: dict[tuple[str, int, int], list[bytes]] = {}
        self.stop_input = asyncio.Event()

    async def start(self) -> None:
        self.nc = await bus.connect(self.url, name="bench-failover")
        self.js = self.nc.jetstream()
        quiet = dict(nats_url=self.url, log_json=True, log_level="warning")
        self.services = [FenceService(FenceConfig(http_port=0, **quiet))]
        self.services += [PlacementService(PlacementConfig(instance_id=f"placement-{i}", **quiet)) for i in range(2)]
        self.services.append(MoverService(MoverConfig(**quiet)))
        for svc in self.services:
            await svc.start()
        self.fence = self.services[0]
        for e in self.engines.values():
            e.start()
        for h in self.engines:
            await until(lambda h=h: self.answers(h), 120)
        placements = [svc for svc in self.services if isinstance(svc, PlacementService)]
        await until(lambda: self._all_seen(placements), 10)
        await self.nc.subscribe("sf.output.*", cb=self._on_output)

    async def _all_seen(self, placements: list[PlacementService]) -> bool:
        return all(p.liveness.entry(h) is not None for p in placements for h in self.engines)

    async def answers(self, host_id: str) -> bool:
        return await answers(self.nc, names.engine_subject(host_id, "ping"))

    async def _on_output(self, msg) -> None:
        c = decode(msg.data, OutputChunk)
        if c.kind != "frames":
            return
        key = (c.session_id, c.block, c.parts)
        parts = self._parts.setdefault(key, [b""] * c.parts)
        parts[c.part] = c.data
        self.chunk_times[c.session_id].append((time.time(), c.block))
        if all(parts):
            digest = hashlib.sha256(b"".join(parts)).hexdigest()
            del self._parts[key]
            seen = self.blocks.setdefault((c.session_id, c.block), {})
            seen[f"{len(seen)}"] = digest

    async def create(self, sid: str) -> str:
        """Register, place and assign `sid`; "" once placed, else the placement's last refusal (a loaded
        machine's hosts measure themselves full: admission refuses, as it must, and the run goes on with
        the sessions that were placed, saying how many were not)."""
        req = RegisterRequest(session_id=sid, backend="avatar", seed=7, prompt="narrator",
                              contract=msgspec.msgpack.encode(CONTRACT), tier=1)
        self.tokens[sid] = (await bus.request(self.nc, names.FENCE_REGISTER, req, RegisterReply)).token
        for attempt in range(10):  # hosts that profiled themselves under load may fit fewer at first
            try:
                p = await bus.request(self.nc, names.PLACEMENT_PLACE, PlaceRequest(
                    session_id=sid, backend="avatar", contract=CONTRACT, guard=Guard()), Placement)
                break
            except errors.Rejected as e:
                if attempt == 9:
                    return f"{e} ({e.fields.get('hosts', '')})"
                await asyncio.sleep(2.0)
        await assign(self.nc, sid, p.host_id, incarnation=p.incarnation)
        return ""

    async def feed(self, sid: str) -> None:
        url = f"http://127.0.0.1:{self.fence.http_port}/v1/sessions/{sid}/items"
        headers = {"Authorization": f"Bearer {self.tokens[sid]}"}
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
            while not self.stop_input.is_set():
                try:
                    async with http.post(url, json={"kind": "text", "data": "hello"}, headers=headers) as r:
                        if r.status == 200:
                            self.accepted[sid] = max(self.accepted[sid], (await r.json())["seq"])
                except (aiohttp.ClientError, TimeoutError):
                    pass
                await asyncio.sleep(INPUT_PERIOD_S)

    async def claimed(self, sid: str) -> tuple[str, int] | None:
        view = (await read_owner(self.js, sid)).view
        if view.claim is None or view.claim != view.owner:
            return None
        return view.owner.server_id, view.owner.version

    async def claim_at(self, sid: str, version: int) -> float:
        """When the claim at `version` landed in fence's log."""
        return (await self.landed_at(sid, version))[1]

    async def landed_at(self, sid: str, version: int) -> tuple[float | None, float]:
        """When the assign and then the claim at `version` landed in fence's log: where a reclaim's time
        went (noticing the death and assigning, against installing the state and claiming)."""
        pos, assigned = 1, None
        while True:
            raw = await patient(lambda pos=pos: bus.next_msg(self.js, names.SESSION_STREAM,
                                                             names.session_log_subject(sid), pos, what="the session log"))
            if raw is None:
                raise AssertionError(f"no claim at v{version} for {sid}")
            record = decode(raw.data, LogRecord)
            if isinstance(record.event, Assign) and record.event.version == version:
                assigned = record.at
            if isinstance(record.event, Claim) and record.event.version == version:
                return assigned, record.at
            pos = raw.seq + 1

    async def info(self, sid: str) -> SessionInfo | None:
        owner = await self.claimed(sid)
        if owner is None:
            return None
        try:
            return await bus.request(self.nc, names.engine_subject(owner[0], "info"), SessionRef(session_id=sid),
                                     SessionInfo, timeout_s=2.0)
        except errors.StatefleetError:
            return None

    async def serving(self) -> dict[str, list[tuple[str, int]]]:
        """host → (session, claimed version) of every session its current process has claimed. A session
        still orphaned by an earlier kill names a process that is dead: counting it sent the next kill to
        that host's fresh restart, which held nothing (the full run of 2 Dec killed e3 three times so)."""
        kv = await self.js.key_value(names.ENGINES_BUCKET)
        live = {}
        for h in self.engines:
            entry = await bus.kv_read(kv, h)
            if entry is not None:
                live[h] = decode(entry.value, EngineEntry).incarnation
        out: dict[str, list[tuple[str, int]]] = defaultdict(list)
        for sid in self.sids:
            v = (await read_owner(self.js, sid)).view
            if v.owner is not None and v.claim == v.owner and live.get(v.owner.server_id) == v.incarnation:
                out[v.owner.server_id].append((sid, v.owner.version))
        return out

    async def kill_round(self) -> list[dict]:
        counts = await self.serving()
        if not counts:
            return []  # every session is waiting for room: nothing to kill
        victim = max(counts, key=lambda h: (len(counts[h]), h))
        t_kill = self.engines[victim].kill()
        self.engines[victim].start()  # the supervisor restarts it: a new incarnation under the same id
        deadline = time.monotonic() + 60  # one minute for the whole kill, not one per session
        out = []
        for sid, version in counts[victim]:
            event = {"session_id": sid, "victim": victim, "to": None, "version": None, "reclaim_s": None,
                     "first_output_after_kill_s": None}
            out.append(event)
            try:
                new = await until(lambda sid=sid, version=version: self._moved_on(sid, version),
                                  deadline - time.monotonic())
            except TimeoutError:
                continue  # unreclaimed
            try:
                assigned, claim = await self.landed_at(sid, new[1])
            except SLOW_BUS:  # the log's records unread (the loaded bus): when the bench saw the claim instead
                assigned, claim = None, time.time()
                event["claim_time_seen"] = True
            event.update(to=new[0], version=new[1], reclaim_s=claim - t_kill,
                         assign_s=None if assigned is None else assigned - t_kill)
            with contextlib.suppress(TimeoutError):
                first = await until(lambda sid=sid, claim=claim: self._first_chunk_after(sid, claim), 30)
                event["first_output_after_kill_s"] = first - t_kill
        with contextlib.suppress(TimeoutError):  # a restart profiling itself on a loaded machine: go on without it
            await until(lambda: self.answers(victim), 120)
        return out

    async def _moved_on(self, sid: str, version: int):
        o = await self.claimed(sid)
        return o if o is not None and o[1] > version else None

    async def _first_chunk_after(self, sid: str, at: float) -> float | None:
        return next((t for t, _ in self.chunk_times[sid] if t >= at), None)

    async def settle(self, sids: list[str], wait_s: float = 60) -> tuple[dict[str, int], int]:
        """(accepted items not applied, per session; applied twice) once each final owner caught up (or gave
        up waiting)."""
        short: dict[str, int] = {}
        twice = 0
        for sid in sids:
            want = self.accepted[sid]

            async def caught_up(sid=sid, want=want):
                info = await self.info(sid)
                return info if info is not None and info.consumed_seq >= want else None

            try:
                info = await until(caught_up, wait_s)
            except TimeoutError:
                info = await self.info(sid)
            consumed = info.consumed_seq if info else 0
            if want > consumed:
                short[sid] = want - consumed
            twice += max(0, consumed - want)
        return short, twice

    async def requeued(self, sids: list[str]) -> dict[str, str]:
        """The sessions fence's summary shows visibly re-queued (orphaned, or shed by overload relief, both
        told to the client as a SessionNotice), each with its reason."""
        kv = await self.js.key_value(names.SESSIONS_BUCKET)
        out = {}
        for sid in sids:
            summary = decode((await kv.get(sid)).value, SessionSummary)
            if summary.state == "orphaned" or summary.shed:
                out[sid] = f"{summary.shed or summary.state}: {summary.reason}"
        return out

    async def orphaned(self) -> int:
        kv = await self.js.key_value(names.SESSIONS_BUCKET)
        n = 0
        for sid in self.sids:
            if decode((await kv.get(sid)).value, SessionSummary).state == "orphaned":
                n += 1
        return n

    def replay_identical(self) -> tuple[bool | None, int, int]:
        twice = [d for d in self.blocks.values() if len(d) > 1]
        differing = sum(len(set(d.values())) > 1 for d in twice)
        return (None if not twice else differing == 0), len(twice), differing

    async def stop(self) -> None:
        for e in self.engines.values():
            if e.proc and e.proc.poll() is None:
                e.proc.kill()
                e.proc.wait()
        for svc in reversed(self.services):
            await svc.stop()
        await self.nc.close()


async def until(fn, timeout_s: float, every_s: float = 0.02):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(*SLOW_BUS):  # a read the loaded bus did not answer in time: not yet
            if (result := await fn()) is not None and result is not False:
                return result
        await asyncio.sleep(every_s)
    raise TimeoutError(f"not reached within {timeout_s}s")


# The bench's own reads of the bus, on a machine the hog loads: one that is not answered in time is asked
# again rather than ending the run (a run under `--hog 2` at load 15 died so, at its second kill).
SLOW_BUS = (errors.Timeout, errors.Unavailable)


async def patient(fn, tries: int = 10, every_s: float = 0.5):
    for _ in range(tries - 1):
        with contextlib.suppress(*SLOW_BUS):
            return await fn()
        await asyncio.sleep(every_s)
    return await fn()


async def run(quick: bool, hog: int = 0, keep_logs: Path | None = None) -> dict:
    hosts, sessions, kills = (3, 4, 3) if quick else (4, 8, 10)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-failover-") as tmp:
        hogs = Hog(hog, Path(tmp))
        hogs.start()  # for the whole run: the stack starts under the load too
        server = NatsServer(store_dir=Path(tmp) / "nats").start()
        b = Bench(server.url, Path(tmp), hosts, sessions)
        trace: HeartbeatTrace | None = None
        try:
            await b.start()
            trace = HeartbeatTrace(b.js, list(b.engines), "avatar")
            trace.start()
            refused = {sid: why for sid in b.sids if (why := await b.create(sid))}
            b.sids = [sid for sid in b.sids if sid not in refused]
            if not b.sids:
                raise RuntimeError(f"no session could be placed: {refused}")
            feeders = [asyncio.create_task(b.feed(sid)) for sid in b.sids]
            await asyncio.sleep(5.0)  # steady input on every session before the first kill
            events: list[dict] = []
            for k in range(kills):
                round_ = await b.kill_round()
                events += round_
                worst = max((e["reclaim_s"] for e in round_ if e["reclaim_s"] is not None), default=None)
                if not round_:
                    print(f"kill {k + 1}/{kills}: none (no host serves a session)", file=sys.stderr)
                    continue
                print(f"kill {k + 1}/{kills}: {round_[0]['victim']} with {len(round_)} sessions; reclaim "
                      f"{'never' if worst is None else f'{worst:.2f}s'} (load {os.getloadavg()[0]:.1f})",
                      file=sys.stderr)
                await asyncio.sleep(3.0)  # steady input again on the new owners
            b.stop_input.set()
            await asyncio.gather(*feeders)
            short, twice = await b.settle(b.sids)
            # An item of a session the capacity rules visibly re-queued is held, not lost: it waits in the
            # session's log for a device with room. Once the load is gone, it must be applied too.
            requeued = await b.requeued(list(short))
            held = {sid: n for sid, n in short.items() if sid in requeued}
            lost = sum(n for sid, n in short.items() if sid not in requeued)
            held_after = None
            if held:
                await hogs.stop()
                after_short, twice_after = await b.settle(list(held), wait_s=120)
                held_after, twice = sum(after_short.values()), twice + twice_after
            identical, compared, differing = b.replay_identical()
            orphaned = await b.orphaned()
            load_during = os.getloadavg()
        finally:
            if trace is not None:
                await trace.stop()
            await b.stop()
            server.stop()
            await hogs.stop()
            if keep_logs is not None:  # the engine hosts' and the hogs' logs, for a run that missed its targets
                await asyncio.to_thread(_keep_logs, Path(tmp), keep_logs)
    reclaim = [e["reclaim_s"] for e in events if e["reclaim_s"] is not None]
    assigned = [e["assign_s"] for e in events if e.get("assign_s") is not None]
    after = [e["reclaim_s"] - e["assign_s"] for e in events if e.get("assign_s") is not None]
    first = [e["first_output_after_kill_s"] for e in events if e["first_output_after_kill_s"] is not None]
    target = TARGET_RECLAIM_P99_HOG_S if hog else TARGET_RECLAIM_P99_S
    return {
        "hog": hog, "hog_runs": hogs.runs, "load_avg_before": load_before[0], "load_avg_at_end": load_during[0],
        "unreclaimed": sum(e["reclaim_s"] is None for e in events),
        # reclaims timed from when the bench saw the claim (an upper bound): fence's log went unread
        "claim_times_seen": sum(bool(e.get("claim_time_seen")) for e in events),
        "no_output_after_claim": sum(e["reclaim_s"] is not None and e["first_output_after_kill_s"] is None
                                     for e in events),
        "kills": kills, "hosts": hosts, "sessions": sessions, "sessions_affected": len(events),
        "refused_at_start": len(refused), "refused_reasons": refused,
        "reclaim_s_p50": percentile(reclaim, 50), "reclaim_s_p99": percentile(reclaim, 99),
        "reclaim_s_max": max(reclaim) if reclaim else None,
        # The reclaim split at fence's assign record: noticing the death and assigning, then installing
        # the state and claiming (what to shorten when the reclaim tail misses).
        "assign_s_p99": percentile(assigned, 99) if assigned else None,
        "claim_after_assign_s_p99": percentile(after, 99) if after else None,
        "first_output_after_kill_s_p99": percentile(first, 99) if first else None,
        # lost: accepted, not applied, its session not visibly re-queued; held: not applied by the end, its
        # session re-queued with a reason its client was told; held_unapplied_after_load: of those, still
        # not applied 120 s after the hog stopped (None when nothing was held)
        "lost_inputs": lost, "inputs_applied_twice": twice, "accepted_inputs": sum(b.accepted.values()),
        "held_inputs": sum(held.values()), "held_sessions": {sid: requeued[sid] for sid in held},
        "held_unapplied_after_load": held_after,
        "replay_bit_identical": identical, "replayed_blocks_compared": compared,
        "replayed_blocks_differing": differing, "orphaned": orphaned,
        "targets": {"reclaim_s_p99": target, "lost_inputs": 0, "inputs_applied_twice": 0, "held_unapplied_after_load": 0,
                    "replay_bit_identical": True, "unreclaimed": 0},
        "settings": {"engine_heartbeat_s": ENGINE_DEFAULTS.heartbeat_s, "dead_after_beats": names.HEARTBEAT_TTL_FACTOR,
                     "input_period_s": INPUT_PERIOD_S, "checkpoint_every_s": ENGINE_DEFAULTS.checkpoint_every_s},
        "events": events,
        # What the heartbeats priced the device at beside what its hosts measured (bench/heartbeat_trace.py)
        "heartbeats": trace.summary() if trace else {}, "heartbeat_samples": trace.samples if trace else [],
    }


def _keep_logs(run_dir: Path, into: Path) -> None:
    into.mkdir(parents=True, exist_ok=True)
    for log in run_dir.glob("*.log"):
        shutil.copy(log, into / log.name)


def main() -> None:
    p = parser("failover", __doc__.splitlines()[0])
    p.add_argument("--hog", type=int, default=0, metavar="N",
                   help="N load processes (each `bench.load --quick`, repeated) beside the stack for the whole run")
    p.add_argument("--logs", type=Path, metavar="DIR", help="keep the engine hosts' and the hogs' logs in DIR")
    args = p.parse_args()
    logs.setup("warning", json=False)
    result = asyncio.run(run(args.quick, args.hog, args.logs))
    target = result["targets"]["reclaim_s_p99"]
    table([("kills", result["kills"], ""), ("sessions_affected", result["sessions_affected"], ""),
           ("refused_at_start", result["refused_at_start"], f"of {result['sessions']}: no host fit them"),
           ("reclaim_s_p50", result["reclaim_s_p50"], ""),
           ("reclaim_s_p99", result["reclaim_s_p99"], f"target ≤ {target}"),
           ("unreclaimed", result["unreclaimed"], "target 0"),
           ("no_output_after_claim", result["no_output_after_claim"], "within 30 s of the claim"),
           ("first_output_after_kill_s_p99", result["first_output_after_kill_s_p99"], ""),
           ("lost_inputs", result["lost_inputs"], "target 0"),
           ("held_inputs", result["held_inputs"], f"of {len(result['held_sessions'])} sessions visibly re-queued"),
           ("held_unapplied_after_load", result["held_unapplied_after_load"], "target 0: applied once the load left"),
           ("inputs_applied_twice", result["inputs_applied_twice"], "target 0"),
           ("replay_bit_identical", result["replay_bit_identical"],
            f"{result['replayed_blocks_differing']}/{result['replayed_blocks_compared']} replayed blocks differ"),
           ("orphaned", result["orphaned"], ""), ("hog", result["hog"], f"load avg at end {result['load_avg_at_end']:.1f}")])
    write(args.json, result)


if __name__ == "__main__":
    main()
