"""The session runtime of one engine host: sessions, their state trees, the stage pipeline and the
EDF quanta scheduler, driven by a thin asyncio shell.

Invariants:
- At most one block of a session is in flight; while `block_boundary(sid)` is held none is,
  so a held session's state tree is stable (what the mover copies, suspend offloads and a
  checkpoint snapshots).
- A session's inputs are applied in `seq` order exactly once: a duplicate or a gap is a
  `Conflict` and changes nothing; every accepted item is folded into exactly one block.
- A session whose block raises is failed and closed in order (its pipeline slots released);
  the host and its other sessions go on.
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import crc32c
import nats.errors
import structlog
import torch

from libs import names
from libs.checkpoint import CheckpointStore, clone_tree, tree_bytes
from libs.checkpoint.tree import split
from libs.errors import BadRequest, Busy, ConfigError, Conflict, NotFound, StatefleetError
from libs.schemas.base import decode, encode
from libs.schemas.common import InputItem, ProfileRow
from libs.schemas.engine import (
    CheckpointRef,
    HostStatus,
    OpenSession,
    SessionDescriptor,
    SessionInfo,
    SessionMetrics,
)
from libs.telemetry import counter
from services.engine_host import output as wire
from services.engine_host import torch_threads
from services.engine_host.backends import Backend, make_backend
from services.engine_host.metrics import SessionStats
from services.engine_host.pipeline import Item, Pipeline, Stage, Work
from services.engine_host.scheduler import PERIODIC, Dispatch, EdfScheduler, Task

log = structlog.get_logger("statefleet.engine_host.runtime")
_output_dropped = counter("sf_engine_output_dropped_total", "Output chunks the bus did not take")

SID_RE = re.compile(r"^[A-Za-z0-9_-]{1,128}$")  # session ids become NATS subject tokens
MAX_PENDING_INPUTS = 256
MAX_ADVANCE_BLOCKS = 100_000
COST_EWMA = 0.2

Publish = Callable[[str, bytes], Awaitable[None]]


@dataclass
class BlockJob:
    session: Session
    inputs: list[Any]
    last_seq: int
    accepted_at: list[float]
    carry: Any = None
    output: Any = None
    encoded: list[wire.Encoded] | None = None  # the output as chunk payloads, made in the decode thread


@dataclass
class Session:
    spec: OpenSession
    backend: Backend
    shape: str
    state: dict
    stats: SessionStats
    status: str = "running"
    input_cursor: int = 0
    consumed_seq: int = 0
    pending: list[tuple[InputItem, Any, float]] = field(default_factory=list)
    blocks_done: int = 0
    target_blocks: int = 0
    pipe_seq: int = -1
    busy: bool = False
    idle: asyncio.Event = field(default_factory=asyncio.Event)
    holds: int = 0
    held_at: float = 0.0
    suspended_at: float = 0.0
    asked_at: float = 0.0
    last_end: float = 0.0
    waiters: list[tuple[int, asyncio.Future]] = field(default_factory=list)
    checkpoint_key: str = ""
    origin: str = "opened"  # "moved": installed by a committed move, waiting for fence to assign it here

    @property
    def sid(self) -> str:
        return self.spec.session_id

    def info(self, task: Task | None) -> SessionInfo:
        s = self.spec
        return SessionInfo(session_id=s.session_id, backend=s.backend, state=self.status,
                           session_class=s.session_class, tier=task.tier if task else s.tier,
                           blocks_done=self.blocks_done, input_cursor=self.input_cursor,
                           consumed_seq=self.consumed_seq, state_bytes=tree_bytes(self.state),
                           skipped_blocks=task.skipped if task else 0)


class EngineRuntime:
    """Runs many sessions on one device. Also the mover's host endpoint (`state_tree`,
    `block_boundary`, `session_descriptor`, `install_state`, `drop_session`)."""

    def __init__(self, device: torch.device | str = "cpu", *, host_id: str = "local",
                 publish: Publish | None = None, checkpoints: CheckpointStore | None = None,
                 backend_configs: dict[str, bytes] | None = None, max_batch: int = 8,
                 max_in_flight: int = 2, guard_s: float = 0.002, max_sessions: int = 64,
                 edge_capacity: int = 2, clock: Callable[[], float] = time.monotonic) -> None:
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:  # tensors report an indexed device
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.host_id = host_id
        self.publish = publish
        self.checkpoints = checkpoints
        self.backend_configs = backend_configs or {}
        self.max_in_flight = max_in_flight
        self.max_sessions = max_sessions
        self.clock = clock
        self.sessions: dict[str, Session] = {}
        self._backends: dict[tuple[str, bytes], Backend] = {}
        self._costs: dict[tuple[str, int, int], float] = {}
        self.sched = EdfScheduler(cost=self._cost, guard_s=guard_s, max_batch=max_batch)
        self.pipeline = Pipeline([Stage("encode", self._encode), Stage("denoise", self._denoise),
                                  Stage("decode", self._decode)], self._on_output,
                                 edge_capacity=edge_capacity, max_sessions=max_sessions)
        self.work = torch_threads.executor("engine-work", workers=2)  # init, offload, snapshots, profile
        self._wake = asyncio.Event()
        self._in_flight = 0
        self._loop_task: asyncio.Task | None = None
        self._background: set[asyncio.Task] = set()
        self.failed: dict[str, str] = {}

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        self.pipeline.start()
        self._loop_task = asyncio.create_task(self._dispatch_loop(), name="engine:dispatch")
        self._loop_task.add_done_callback(_dispatcher_exited)

    async def stop(self) -> None:
        """Stop dispatching, close every session (in-flight blocks finish), stop the stages."""
        if self._loop_task is not None:
            self._loop_task.cancel()
            await asyncio.gather(self._loop_task, return_exceptions=True)
        await asyncio.gather(*self._background, return_exceptions=True)
        for sid in list(self.sessions):
            try:
                await self.close(sid, drain=True)
            except Exception as e:  # counted by the pipeline; the other sessions still close
                log.error("session_close_failed", session_id=sid, error=repr(e))
        await self.pipeline.shutdown()
        self.work.shutdown(wait=False)

    async def in_thread(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run model or bulk tensor work off the event loop, on a thread with the host's torch threads."""
        return await asyncio.get_running_loop().run_in_executor(self.work, lambda: fn(*args, **kwargs))

    # ------------------------------------------------------------ backends and costs

    def backend(self, name: str, config: bytes | None = None) -> Backend:
        cfg = self.backend_configs.get(name, b"") if config is None else config
        key = (name, cfg)
        if key not in self._backends:
            self._backends[key] = make_backend(name, cfg, self.device)
        return self._backends[key]

    @staticmethod
    def shape_of(backend: Backend) -> str:
        return f"{backend.name}:{crc32c.crc32c(backend.config_bytes()):08x}"

    def _cost(self, shape: str, tier: int, n: int) -> float:
        """Estimated seconds of one quantum: measured for this batch size, else n × the single block."""
        if (c := self._costs.get((shape, tier, n))) is not None:
            return c
        return self._costs.get((shape, tier, 1), 0.0) * n

    def _learn_cost(self, shape: str, tier: int, n: int, seconds: float) -> None:
        key = (shape, tier, n)
        old = self._costs.get(key)
        self._costs[key] = seconds if old is None else (1 - COST_EWMA) * old + COST_EWMA * seconds

    def seed_costs(self, rows: list[ProfileRow]) -> None:
        """Start the cost estimates from profile rows measured at start-up (default configs)."""
        for r in rows:
            self._costs.setdefault((self.shape_of(self.backend(r.backend)), r.tier, 1), r.quantum_ms / 1000)

    # ------------------------------------------------------------ sessions

    def _get(self, sid: str) -> Session:
        s = self.sessions.get(sid)
        if s is None or s.status == "failed":  # a failed session is being released; it is gone
            why = f" (failed: {self.failed[sid]})" if sid in self.failed else ""
            raise NotFound(f"session {sid} is not on host {self.host_id}{why}", session_id=sid,
                           host_id=self.host_id)
        return s

    def _validate_open(self, spec: OpenSession) -> Backend:
        if not SID_RE.match(spec.session_id):
            raise BadRequest(f"session id must match {SID_RE.pattern}", session_id=spec.session_id)
        if spec.session_id in self.sessions:
            raise Conflict(f"session {spec.session_id} is already open on {self.host_id}",
                           session_id=spec.session_id)
        if len(self.sessions) >= self.max_sessions:
            raise Busy(f"host {self.host_id} holds its maximum of {self.max_sessions} sessions",
                       host_id=self.host_id)
        backend = self.backend(spec.backend)
        for name, tier in (("tier", spec.tier), ("quality_floor", spec.quality_floor)):
            if tier and tier not in backend.tiers:
                raise BadRequest(f"{name} {tier} is not one of {spec.backend}'s tiers {backend.tiers}",
                                 session_id=spec.session_id)
        if spec.tier and spec.quality_floor > spec.tier:
            raise BadRequest("quality_floor is above the requested tier", session_id=spec.session_id)
        periodic = spec.session_class in PERIODIC
        if periodic != (spec.period_ms > 0) or not math.isfinite(spec.period_ms):
            raise BadRequest(f"{spec.session_class} sessions {'need' if periodic else 'take no'} period_ms",
                             session_id=spec.session_id)
        return backend

    async def open(self, spec: OpenSession) -> SessionInfo:
        backend = self._validate_open(spec)
        state = await self.in_thread(backend.init_state, spec.seed, spec.prompt)
        return (await self._admit(spec, backend, state)).info(self.sched.tasks.get(spec.session_id))

    async def _admit(self, spec: OpenSession, backend: Backend, state: dict) -> Session:
        now = self.clock()
        s = Session(spec=spec, backend=backend, shape=self.shape_of(backend), state=state,
                    stats=SessionStats(spec.session_id, spec.backend, backend.media_s_per_block, now),
                    last_end=now)
        s.idle.set()
        await self.pipeline.open(spec.session_id)
        ladder = tuple(t for t in backend.tiers if t >= (spec.quality_floor or backend.tiers[0]))
        self.sched.add(Task(sid=spec.session_id, cls=spec.session_class, shape=s.shape, ladder=ladder,
                            tier=spec.tier or ladder[-1], period_s=spec.period_ms / 1000,
                            batchable=backend.batchable and spec.determinism != "T0"), now)
        self.sessions[spec.session_id] = s
        self.failed.pop(spec.session_id, None)
        self._wake.set()
        return s

    async def close(self, sid: str, *, drain: bool = True) -> SessionInfo:
        """Ordered shutdown of one session: stop scheduling it, drain or cancel its block, release
        its pipeline slots last stage first, verify none is left."""
        s = self._get(sid)
        task = self.sched.tasks.get(sid)
        info = s.info(task)
        s.status = "closing"
        self.sched.remove(sid)
        try:
            await self.pipeline.close(sid, drain=drain)
        finally:
            self.sessions.pop(sid, None)
            self._fail_waiters(s, Conflict(f"session {sid} was closed", session_id=sid))
            self._wake.set()
        return SessionInfo(**{**_fields(info), "state": "closed"})

    async def apply_input(self, item: InputItem) -> int:
        """Accept one released input item, in seq order; returns the session's new input cursor."""
        s = self._get(item.session_id)
        if s.status not in ("running", "suspended"):
            raise Conflict(f"session {item.session_id} is {s.status}", session_id=item.session_id)
        if item.seq <= s.input_cursor:
            raise Conflict(f"input {item.seq} is a duplicate (cursor {s.input_cursor})",
                           session_id=item.session_id, seq=item.seq, cursor=s.input_cursor, reason="duplicate")
        if item.seq != s.input_cursor + 1:
            raise Conflict(f"input {item.seq} leaves a gap after {s.input_cursor}",
                           session_id=item.session_id, seq=item.seq, cursor=s.input_cursor, reason="gap")
        parsed = s.backend.parse_input(item)
        if len(s.pending) >= MAX_PENDING_INPUTS:
            raise Busy(f"session {item.session_id} has {MAX_PENDING_INPUTS} inputs waiting for a block",
                       session_id=item.session_id)
        s.pending.append((item, parsed, self.clock()))
        s.input_cursor = item.seq
        return s.input_cursor

    async def advance(self, sid: str, blocks: int = 1) -> SessionInfo:
        """Run `blocks` more blocks of a non-periodic session and return once they are done."""
        s = self._get(sid)
        if s.spec.session_class in PERIODIC:
            raise Conflict(f"{s.spec.session_class} session {sid} runs on its own period", session_id=sid)
        if s.status != "running":
            raise Conflict(f"session {sid} is {s.status}", session_id=sid)
        if not 1 <= blocks <= MAX_ADVANCE_BLOCKS:
            raise BadRequest(f"blocks must be 1..{MAX_ADVANCE_BLOCKS}", session_id=sid)
        s.target_blocks = max(s.target_blocks, s.blocks_done) + blocks
        done = asyncio.get_running_loop().create_future()
        s.waiters.append((s.target_blocks, done))
        if self.sched.tasks[sid].budget == 0:
            s.asked_at = self.clock()
        self.sched.ask(sid, blocks)
        self._wake.set()
        await done
        return s.info(self.sched.tasks.get(sid))

    def info(self, sid: str) -> SessionInfo:
        return self._get(sid).info(self.sched.tasks.get(sid))

    def metrics(self, sid: str) -> SessionMetrics:
        s = self._get(sid)
        t = self.sched.tasks.get(sid)
        return s.stats.snapshot(skipped=t.skipped if t else 0, tier=t.tier if t else 0,
                                tier_changes=t.tier_changes if t else 0)

    def busy_fraction(self) -> float:
        """Share of device time the periodic sessions' steady-state quanta take."""
        return sum(self._cost(t.shape, t.tier, 1) / t.period_s for t in self.sched.tasks.values()
                   if t.cls in PERIODIC and not t.paused)

    def state_bytes_resident(self) -> int:
        return sum(tree_bytes(s.state) for s in self.sessions.values() if s.status != "suspended")

    def status(self) -> HostStatus:
        sids = sorted(self.sessions)
        return HostStatus(host_id=self.host_id, device=str(self.device), sessions=[self.info(x) for x in sids],
                          metrics=[self.metrics(x) for x in sids], pipeline=self.pipeline.counters,
                          busy_fraction=self.busy_fraction(), state_bytes_resident=self.state_bytes_resident())

    # ------------------------------------------------------------ block boundary, offload, checkpoints

    def block_boundary(self, session_id: str) -> AbstractAsyncContextManager[None]:
        """While held, no block of the session runs (the one in flight, if any, finishes first)."""
        return self._boundary(self._get(session_id))

    @asynccontextmanager
    async def _boundary(self, s: Session) -> AsyncIterator[None]:
        s.holds += 1
        if s.holds == 1:
            s.held_at = self.clock()
        if s.sid in self.sched.tasks:
            self.sched.pause(s.sid, True, self.clock())
        try:
            await s.idle.wait()
            yield
        finally:
            s.holds -= 1
            if s.holds == 0:
                now = self.clock()
                s.stats.idle_interval(max(s.held_at, s.last_end), now, "block_boundary")
                s.last_end = max(s.last_end, now)
                if s.status == "running" and s.sid in self.sched.tasks:
                    self.sched.pause(s.sid, False, now)
                self._wake.set()

    async def suspend(self, sid: str) -> SessionInfo:
        """Offload an idle session's state to host memory (pinned where there is a GPU)."""
        s = self._get(sid)
        if s.status != "running":
            raise Conflict(f"session {sid} is {s.status}, not running", session_id=sid)
        async with self._boundary(s):
            pin = self.device.type == "cuda"
            s.state = await self.in_thread(clone_tree, s.state, "cpu", pin=pin)
            s.status, s.suspended_at = "suspended", self.clock()
            self.sched.pause(sid, True, s.suspended_at)
        return self.info(sid)

    async def resume(self, sid: str) -> SessionInfo:
        s = self._get(sid)
        if s.status != "suspended":
            raise Conflict(f"session {sid} is {s.status}, not suspended", session_id=sid)
        async with self._boundary(s):
            s.state = await self.in_thread(clone_tree, s.state, self.device)
            now = self.clock()
            s.stats.idle_interval(s.suspended_at, now, "suspended")
            s.status, s.last_end = "running", now
        return self.info(sid)

    async def checkpoint(self, sid: str, *, delete_previous: bool = True) -> CheckpointRef:
        """Snapshot the session at a block boundary into the checkpoint store (for failover);
        the previous checkpoint of the session is deleted once the new one is committed, unless
        the caller still has to record the new one elsewhere first (`delete_previous=False`)."""
        if self.checkpoints is None:
            raise ConfigError("this host has no checkpoint store configured", host_id=self.host_id)
        s = self._get(sid)
        async with self._boundary(s):
            snapshot = await self.in_thread(clone_tree, s.state, "cpu")
            desc = self._descriptor(s, with_pending=False)
            key = f"{sid}.b{s.blocks_done}"
        m = await self.checkpoints.put(key, snapshot, encode(desc), copy=False)
        previous, s.checkpoint_key = s.checkpoint_key, key
        if delete_previous and previous and previous != key:
            try:
                await self.checkpoints.delete(previous)
            except NotFound:
                pass
        return CheckpointRef(session_id=sid, key=key, location=m.location, total_bytes=m.total_bytes,
                             blocks_done=desc.blocks_done, consumed_seq=desc.consumed_seq)

    async def restore(self, sid: str, key: str) -> SessionInfo:
        """Create the session from a checkpoint (failover); input resumes after its consumed cursor."""
        if self.checkpoints is None:
            raise ConfigError("this host has no checkpoint store configured", host_id=self.host_id)
        if sid in self.sessions:
            raise Conflict(f"session {sid} is already open on {self.host_id}", session_id=sid)
        tree, desc = await self.checkpoints.get(key, self.device)
        await self.install_state(sid, tree, desc)
        self.sessions[sid].checkpoint_key = key
        return self.info(sid)

    # ------------------------------------------------------------ the mover's host endpoint

    def state_tree(self, session_id: str) -> dict:
        return self._get(session_id).state

    def session_descriptor(self, session_id: str) -> bytes:
        return encode(self._descriptor(self._get(session_id), with_pending=True))

    def _descriptor(self, s: Session, *, with_pending: bool) -> SessionDescriptor:
        sp = s.spec
        task = self.sched.tasks.get(s.sid)
        return SessionDescriptor(
            session_id=s.sid, backend=sp.backend, seed=sp.seed, prompt=sp.prompt,
            tier=task.tier if task else sp.tier, quality_floor=sp.quality_floor, session_class=sp.session_class,
            period_ms=sp.period_ms, determinism=sp.determinism, backend_config=s.backend.config_bytes(),
            blocks_done=s.blocks_done,
            input_cursor=s.input_cursor if with_pending else s.consumed_seq, consumed_seq=s.consumed_seq,
            pending=[item for item, _, _ in s.pending] if with_pending else [])

    async def install_state(self, session_id: str, tree: dict, descriptor: bytes) -> None:
        """Make `tree` (already on this device) the session's live state, creating the session if
        this host does not hold it. Nothing changes unless tree and descriptor both check out."""
        d = decode(descriptor, SessionDescriptor)
        if d.session_id != session_id:
            raise BadRequest(f"descriptor is for {d.session_id}, not {session_id}", session_id=session_id)
        backend = self.backend(d.backend, d.backend_config)
        self._check_tree(session_id, backend, tree)
        pending = [(item, backend.parse_input(item), self.clock()) for item in d.pending]
        s = self.sessions.get(session_id)
        if s is None:
            spec = OpenSession(session_id=session_id, backend=d.backend, seed=d.seed, prompt=d.prompt, tier=d.tier,
                               quality_floor=d.quality_floor, session_class=d.session_class,
                               period_ms=d.period_ms, determinism=d.determinism)
            if not SID_RE.match(session_id):
                raise BadRequest(f"session id must match {SID_RE.pattern}", session_id=session_id)
            s = await self._admit(spec, backend, tree)
            s.origin = "moved"
            _take_progress(s, d, pending)  # no await since _admit: no block can have run yet
            return
        if s.status != "running" or s.shape != self.shape_of(backend):
            raise Conflict(f"session {session_id} is {s.status} or of another shape", session_id=session_id)
        async with self._boundary(s):
            s.state = tree
            _take_progress(s, d, pending)

    def _check_tree(self, sid: str, backend: Backend, tree: dict) -> None:
        spec = backend.state_spec()
        if not isinstance(tree, dict) or set(tree) != set(spec):
            raise BadRequest(f"state tree keys do not match the {backend.name} backend", session_id=sid)
        for key, want in spec.items():
            v = tree[key]
            if isinstance(want, tuple):
                ok = (isinstance(v, torch.Tensor) and v.dtype == want[0] and tuple(v.shape) == want[1]
                      and v.device == self.device)
            else:
                ok = type(v) is want
            if not ok:
                raise BadRequest(f"state leaf {key} does not match the {backend.name} backend on {self.device}",
                                 session_id=sid, leaf=key)
        split(tree)  # rejects anything that is not a tensor or scalar

    async def drop_session(self, session_id: str) -> None:
        """Release the source copy after a committed move (no more blocks, no output)."""
        await self.close(session_id, drain=False)

    # ------------------------------------------------------------ the dispatcher

    async def _dispatch_loop(self) -> None:
        while True:
            self._wake.clear()
            timeout: float | None = None
            if self._in_flight < self.max_in_flight:
                now = self.clock()
                d = self.sched.pick(now)
                if isinstance(d, Dispatch):
                    await self._start(d, now)
                    continue
                timeout = None if math.isinf(d.until) else max(0.0, d.until - now)
            # a timer handle, not wait_for: no task is created per wait on this hot path
            timer = None if timeout is None else asyncio.get_running_loop().call_later(timeout, self._wake.set)
            await self._wake.wait()
            if timer is not None:
                timer.cancel()

    async def _start(self, d: Dispatch, now: float) -> None:
        items = []
        for sid, deadline in zip(d.sids, d.deadlines, strict=True):
            s = self.sessions[sid]
            self._note_wait(s, now, deadline)
            taken, s.pending = s.pending, []
            s.busy = True
            s.idle.clear()
            s.pipe_seq += 1
            job = BlockJob(session=s, inputs=[p for _, p, _ in taken],
                           last_seq=taken[-1][0].seq if taken else s.consumed_seq,
                           accepted_at=[t for _, _, t in taken])
            items.append(Item(sid=sid, seq=s.pipe_seq, epoch=0, data=job))
        self._in_flight += 1
        try:
            await self.pipeline.submit(Work(items=items, meta=d))
        except StatefleetError as e:  # closed between pick and submit: the quantum never started
            log.info("dispatch_dropped", sessions=d.sids, reason=e.detail)
            for it in items:
                self._finish_block(it.data.session, now)
            self.sched.done(d, now)
            self._in_flight -= 1

    def _note_wait(self, s: Session, now: float, deadline: float) -> None:
        """Split the gap since the session's last block into waiting-for-work and waiting-for-device."""
        task = self.sched.tasks[s.sid]
        ready_at = deadline - task.period_s if task.cls in PERIODIC else s.asked_at
        ready_at = min(max(ready_at, s.last_end), now)
        s.stats.idle_interval(s.last_end, ready_at, "waiting_release" if task.cls in PERIODIC else "no_budget")
        s.stats.idle_interval(ready_at, now, "device_busy")

    # the three stages (each runs on its own actor's thread)

    def _encode(self, work: Work) -> None:
        for it in work.items:
            job = it.data
            job.carry = job.session.backend.encode(job.session.state, job.inputs)

    def _denoise(self, work: Work) -> None:
        jobs = [it.data for it in work.items]
        backend = jobs[0].session.backend
        carries = backend.denoise_batch([j.session.state for j in jobs], [j.carry for j in jobs], work.meta.tier)
        for j, c in zip(jobs, carries, strict=True):
            j.carry = c

    def _decode(self, work: Work) -> None:
        for it in work.items:
            job = it.data
            job.output = job.session.backend.decode(job.session.state, job.carry)
            if job.output.frames.device.type == "cuda":
                torch.cuda.synchronize(job.output.frames.device)
            if self.publish is not None:
                job.encoded = wire.encode(job.output)

    async def _on_output(self, work: Work) -> None:
        """The sink: publish each block's output, account it, and tell the scheduler."""
        d: Dispatch = work.meta
        now = self.clock()
        try:
            for it in work.items:
                job: BlockJob = it.data
                s = job.session
                if it.error is not None:
                    self._fail(s, it.error)
                    continue
                s.blocks_done += 1
                s.consumed_seq = job.last_seq
                s.stats.output(now, job.accepted_at, work.stage_ms)
                if self.publish is not None:
                    await self._publish_output(s, job)
                self._finish_block(s, now)
            if work.items and all(it.error is None for it in work.items):
                self._learn_cost(work.items[0].data.session.shape, d.tier, len(work.items),
                                 sum(work.stage_ms.values()) / 1000)
        finally:
            before = {sid: t.skipped for sid in d.sids if (t := self.sched.tasks.get(sid))}
            self.sched.done(d, self.clock())
            for sid, n in before.items():
                if (s := self.sessions.get(sid)) is not None:
                    s.stats.skipped(self.sched.tasks[sid].skipped - n)
            self._in_flight -= 1
            self._wake.set()

    async def _publish_output(self, s: Session, job: BlockJob) -> None:
        """Output is a stream for a live viewer: a chunk the bus cannot take is dropped and counted,
        never allowed to stop the session (its state already advanced) or the sink actor."""
        try:
            for chunk in wire.chunks(s.sid, s.blocks_done, job.encoded,
                                     media_s=s.backend.media_s_per_block, input_seq=job.last_seq):
                await self.publish(names.output_subject(s.sid), encode(chunk))
        except nats.errors.Error as e:
            _output_dropped.add(1, {"reason": type(e).__name__})
            log.warning("output_dropped", session_id=s.sid, block=s.blocks_done, error=type(e).__name__)

    def _finish_block(self, s: Session, now: float) -> None:
        s.busy = False
        s.idle.set()
        s.last_end = now
        still = []
        for target, fut in s.waiters:
            if s.blocks_done >= target:
                if not fut.done():
                    fut.set_result(None)
            else:
                still.append((target, fut))
        s.waiters = still

    def _fail(self, s: Session, error: BaseException) -> None:
        """A block raised: fail the session and close it in order; the host goes on."""
        log.warning("session_failed", session_id=s.sid, error=repr(error))
        self.failed[s.sid] = repr(error)
        s.status = "failed"
        s.busy = False
        s.idle.set()
        self.sched.remove(s.sid)
        self._fail_waiters(s, Conflict(f"session {s.sid} failed: {error!r}", session_id=s.sid))
        task = asyncio.create_task(self._close_failed(s.sid))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _close_failed(self, sid: str) -> None:
        try:
            await self.pipeline.close(sid, drain=False)
        except Exception as e:
            log.error("failed_session_cleanup_failed", session_id=sid, error=repr(e))
        finally:
            self.sessions.pop(sid, None)

    @staticmethod
    def _fail_waiters(s: Session, error: Exception) -> None:
        for _, fut in s.waiters:
            if not fut.done():
                fut.set_exception(error)
        s.waiters = []


def _dispatcher_exited(task: asyncio.Task) -> None:
    """The dispatcher ends only when stopped; anything else would silently stop every session."""
    if not task.cancelled() and task.exception() is not None:
        log.error("dispatcher_died", error=repr(task.exception()))


def _take_progress(s: Session, d: SessionDescriptor, pending: list) -> None:
    s.blocks_done, s.target_blocks = d.blocks_done, d.blocks_done
    s.input_cursor, s.consumed_seq, s.pending = d.input_cursor, d.consumed_seq, pending


def _fields(msg: Any) -> dict:
    return {f: getattr(msg, f) for f in msg.__struct_fields__}
