"""The session runtime of one engine host, composed of its parts (each in its own module):

- `session`: the session table and input order; `lifecycle`: open, close, failing a session;
- `costs`: the backends and what their quanta cost; `scheduler`: the EDF quanta scheduler;
- `dispatcher` → `pipeline` (the `stages` bodies on stage actors) → `sink`: blocks run and published;
- `boundary`, `offload`, `snapshots`, `host_endpoint`: holding a session between blocks, suspend and
  resume, checkpoint and restore, and the mover's view of the host.

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
import functools
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, TypeVar

import msgspec
import structlog
import torch

from libs.checkpoint import CheckpointStore, tree_bytes
from libs.contracts import block_ms_at
from libs.errors import BadRequest, Conflict
from libs.fence.block_journal import BlockJournal
from libs.schemas.common import BackendInfo, InputItem, ProfileRow
from libs.schemas.engine import CheckpointRef, HostStatus, OpenSession, SessionInfo, SessionMetrics
from libs.schemas.fence import ConsumedBlock
from libs.session_classes import PERIODIC
from services.engine_host import torch_threads
from services.engine_host.backends import Backend, Registry
from services.engine_host.boundary import Boundaries
from services.engine_host.costs import Backends, CostModel, shape_of
from services.engine_host.dispatcher import Dispatcher
from services.engine_host.host_endpoint import HostEndpoint, backend_info
from services.engine_host.journal import QUIET_BLOCKS, OutputJournal
from services.engine_host.lifecycle import Lifecycle
from services.engine_host.offload import Offload
from services.engine_host.outbox import Outbox, PublishBlock
from services.engine_host.pipeline import StagePipeline
from services.engine_host.rebuild_choice import RebuildChoice, RebuildPolicy
from services.engine_host.scheduler import Dispatch, EdfScheduler
from services.engine_host.session import Rejected, SessionTable
from services.engine_host.sink import OutputSink, Publish
from services.engine_host.snapshots import Snapshots
from services.engine_host.stages import BlockJob, BlockWork, block_stages

log = structlog.get_logger("statefleet.engine_host.runtime")

MAX_ADVANCE_BLOCKS = 100_000

T = TypeVar("T")


class EngineRuntime:
    """Runs many sessions on one device. Also the mover's host endpoint (`state_tree`,
    `block_boundary`, `session_descriptor`, `install_state`, `drop_session`) and the fenced host
    that `assignments.Assignments` drives."""

    def __init__(self, device: torch.device | str = "cpu", *, host_id: str = "local",
                 publish: Publish | None = None, checkpoints: CheckpointStore | None = None,
                 backend_configs: dict[str, bytes] | None = None, registry: Registry | None = None,
                 max_batch: int = 8,
                 max_in_flight: int = 2, guard_s: float = 0.002, max_sessions: int = 64,
                 edge_capacity: int = 2, clock: Callable[[], float] = time.monotonic,
                 rebuild_policy: RebuildPolicy = "auto", move_wire_bps: float = 1.25e9,
                 gate_moved_in: bool = False, c1_pacing: bool = True) -> None:
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:  # tensors report an indexed device
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.host_id = host_id
        self.clock = clock
        # A fenced host journals every block before its output goes out, and only a claimed owner has a
        # journal: a session a move installs runs no block until fence assigns it here and it is claimed.
        self.gate_moved_in = gate_moved_in
        self.checkpoints = checkpoints
        self.work = torch_threads.executor("engine-work", workers=2)  # init, offload, snapshots, profile
        self.threads = torch.get_num_threads()  # this host's intra-op count (a T0/T1 session keeps its own)
        self.sessions = SessionTable(host_id)
        self.costs = CostModel(clock, concurrency=lambda: len(self._counted()))
        self.backends = Backends(self.device, backend_configs or {}, registry or Registry(), on_build=self.costs.shape)
        self.sched = EdfScheduler(cost=self.costs.estimate, guard_s=guard_s, max_batch=max_batch)
        self.pipeline: StagePipeline[BlockJob, Dispatch] = StagePipeline(
            block_stages(), self._sink, edge_capacity=edge_capacity, max_sessions=max_sessions)
        self.dispatcher = Dispatcher(self.sched, self.sessions, self.pipeline, max_in_flight=max_in_flight,
                                     clock=clock)
        wake = self.dispatcher.wake
        self.boundaries = Boundaries(self.sched, clock, wake)
        self.lifecycle = Lifecycle(self.sessions, self.backends, self.sched, self.pipeline,
                                   max_sessions=max_sessions, in_thread=self.in_thread, clock=clock, wake=wake,
                                   gate=self.boundaries.gate, c1_pacing=c1_pacing, threads=self.threads)
        self.sink = OutputSink(publish, self.costs, fail=self.lifecycle.fail, clock=clock)
        self.rebuilds = RebuildChoice(rebuild_policy, move_wire_bps)
        self.endpoint = HostEndpoint(self.sessions, self.backends, self.lifecycle, self.boundaries,
                                     self.sched.tasks.get, clock=clock, in_thread=self.in_thread,
                                     rebuilds=self.rebuilds)
        self.offload = Offload(self.sessions, self.boundaries, self.sched, self.device,
                               in_thread=self.in_thread, clock=clock)
        self.snapshots = Snapshots(checkpoints, self.sessions, self.boundaries, self.sched.tasks.get, self.device,
                                   install=self.endpoint.install_state, in_thread=self.in_thread)

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        self.pipeline.start()
        self.dispatcher.start()

    async def stop(self) -> None:
        """Stop dispatching, close every session (in-flight blocks finish), stop the stages."""
        await self.dispatcher.stop()
        await self.lifecycle.settle()
        for s in self.sessions:
            try:
                await self.lifecycle.close(s.sid, finish=True)
            except Exception as e:  # counted by the pipeline; the other sessions still close
                log.error("session_close_failed", session_id=s.sid, error=repr(e))
        await self.pipeline.shutdown()
        self.work.shutdown(wait=False)

    async def in_thread(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run model or bulk tensor work off the event loop, on a thread with the host's torch threads."""
        return await asyncio.get_running_loop().run_in_executor(self.work, lambda: fn(*args, **kwargs))

    async def _sink(self, work: BlockWork) -> None:
        try:
            await self.sink.take(work)
        finally:
            self.dispatcher.quantum_done(work.meta)

    # ------------------------------------------------------------ backends and costs

    def backend(self, name: str, config: bytes | None = None) -> Backend:
        return self.backends.get(name, config)

    def seed_costs(self, rows: list[ProfileRow]) -> None:
        """Start the cost estimates (and the rebuild times a move's choice weighs) from profile rows
        measured at start-up (default configs). A block's cost is every stage's (`block_ms`): that is
        what serving learns (the sink sums the stage timings) and what admission prices."""
        for r in rows:
            backend = self.backend(r.backend)
            self.costs.seed(shape_of(backend), r.tier, r.block_ms / 1000, curve=functools.partial(block_ms_at, r))
            if r.rebuild_ms and self.rebuilds.rebuild_s(backend) is None:
                self.rebuilds.observe(backend, r.rebuild_ms / 1000)

    # ------------------------------------------------------------ session verbs

    async def open(self, spec: OpenSession, *, gated: bool = False) -> SessionInfo:
        """Create a session from its seed; a gated one runs no block until `ungate`."""
        await self.lifecycle.open(spec, gated=gated)
        return self.info(spec.session_id)

    async def close(self, sid: str, *, finish: bool = True) -> SessionInfo:
        return await self.lifecycle.close(sid, finish=finish)

    async def apply_input(self, item: InputItem) -> int:
        """Accept one released input item, in seq order; returns the session's new input cursor.
        An item the backend refuses is skipped and reported on the session's output stream."""
        s = self.sessions.get(item.session_id)
        accepted = s.accept(item, self.clock())
        if isinstance(accepted, Rejected):
            await self.sink.report_rejected(s, accepted)
            return s.input_cursor
        return accepted

    async def advance(self, sid: str, blocks: int = 1) -> SessionInfo:
        """Run `blocks` more blocks of a non-periodic session and return once they are done."""
        s = self.sessions.get(sid)
        if s.spec.session_class in PERIODIC:
            raise Conflict(f"{s.spec.session_class} session {sid} runs on its own period", session_id=sid)
        if s.status != "running":
            raise Conflict(f"session {sid} is {s.status}", session_id=sid)
        if not 1 <= blocks <= MAX_ADVANCE_BLOCKS:
            raise BadRequest(f"blocks must be 1..{MAX_ADVANCE_BLOCKS}", session_id=sid)
        s.target_blocks = max(s.target_blocks, s.blocks_done) + blocks
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        s.waiters.append((s.target_blocks, done))
        if self.sched.tasks[sid].budget == 0:
            s.asked_at = self.clock()
        self.sched.ask(sid, blocks)
        self.dispatcher.wake()
        await done
        if s.outbox is not None:  # done means shown too: its output is out (a journal's may still wait)
            await s.outbox.flushed()
        return s.info(self.sched.tasks.get(sid))

    async def suspend(self, sid: str, hold_share: bool = False) -> SessionInfo:
        """Offload a session's state to host memory (pinned where there is a GPU). `hold_share`: its device
        share stays in this host's load while it waits to resume (`Session.holds_share`)."""
        await self.offload.suspend(sid, hold_share)
        return self.info(sid)

    async def resume(self, sid: str) -> SessionInfo:
        await self.offload.resume(sid)
        return self.info(sid)

    async def checkpoint(self, sid: str, *, delete_previous: bool = True) -> CheckpointRef:
        """Snapshot the session at a block boundary into the checkpoint store (see `Snapshots.checkpoint`)."""
        return await self.snapshots.checkpoint(sid, delete_previous=delete_previous)

    async def restore(self, sid: str, key: str, *, gated: bool = False) -> SessionInfo:
        """Create the session from a checkpoint (failover); input resumes after its consumed cursor.
        A gated one runs no block until `ungate`."""
        await self.snapshots.restore(sid, key, gated=gated)
        return self.info(sid)

    async def delete_checkpoint(self, key: str) -> None:
        await self.snapshots.delete(key)

    # ------------------------------------------------------------ exact recovery (a fenced session)

    def gate(self, sid: str) -> None:
        """Schedule no new block of the session until `ungate` (the one in flight finishes). A moved-in
        session still gated since its install is handed over as it is (that hold becomes this one)."""
        s = self.sessions.get(sid)
        if s.install_gated:
            s.install_gated = False
            return
        self.boundaries.gate(s)

    def ungate(self, sid: str) -> None:
        self.boundaries.ungate(self.sessions.get(sid))

    def attach_journal(self, sid: str, writer: BlockJournal) -> OutputJournal:
        """From now on the session's output is published only once its blocks are in `writer`'s journal."""
        s = self.sessions.get(sid)
        if s.journal is not None:
            raise Conflict(f"session {sid} already has a journal", session_id=sid)
        # Only a periodic session runs blocks nobody asked for: a replacement may regenerate a quiet
        # window it never showed. A non-periodic one runs exactly the blocks `advance` asks for.
        quiet = QUIET_BLOCKS if s.spec.period_ms > 0 else 0
        publish = functools.partial(self.sink.publish_block, s)
        if s.outbox is not None:  # blocks it ran before the journal go out before any the journal publishes
            publish = functools.partial(_after, s.outbox, publish)
        s.journal = OutputJournal(writer, publish, quiet)
        return s.journal

    async def replay_block(self, sid: str, block: ConsumedBlock) -> None:
        """Regenerate the gated session's next block exactly as the journal recorded it (its items, which
        must all be accepted, and its tier); returns once it is through the sink."""
        # Not while a checkpoint, a move or a suspend holds it (they pause the scheduler, which this
        # block does not go through): their copy of the tree must not see it half-written.
        while True:
            await self.boundaries.clear(self.sessions.get(sid))
            s = self.sessions.get(sid)
            if s.status != "suspended":
                break
            await self.offload.resume(sid)  # an idle offload took it meanwhile: blocks run on device state
        if (block.block, block.first_seq) != (s.blocks_done + 1, s.consumed_seq + 1) or s.input_cursor < block.last_seq:
            raise Conflict(f"block {block.block} (items {block.first_seq}..{block.last_seq}) cannot follow block "
                           f"{s.blocks_done} (consumed {s.consumed_seq}, accepted {s.input_cursor})", session_id=sid)
        await self.dispatcher.submit_exact(s, block)
        await s.idle.wait()
        self.sessions.get(sid)  # NotFound (naming the failure) if the block failed the session

    # ------------------------------------------------------------ reading

    def holds(self, sid: str) -> bool:
        """Whether the host holds the session at all (failed ones included, until released)."""
        return sid in self.sessions

    def moved_in(self) -> set[str]:
        """Sessions a committed move installed here (fence may not have assigned them here yet)."""
        return {s.sid for s in self.sessions if s.origin == "moved"}

    def info(self, sid: str) -> SessionInfo:
        return self.sessions.get(sid).info(self.sched.tasks.get(sid))

    def metrics(self, sid: str) -> SessionMetrics:
        s = self.sessions.get(sid)
        t = self.sched.tasks.get(sid)
        return s.stats.snapshot(skipped=t.skipped if t else 0, tier=t.tier if t else 0,
                                tier_changes=t.tier_changes if t else 0)

    def busy_fraction(self) -> float:
        """Share of device time the periodic sessions are promised: their blocks (every stage) at their
        quality floors, at the costs learned while serving, carried to the number of sessions the host
        holds now (`CostModel.price`). This is what admission budgets for each of them (`contracts.demand`
        at the floor row), so the two count the same thing; the scheduler steps sessions down toward their
        floors whenever what they are served at would not fit. A session held at a block boundary (a
        checkpoint, a move) still counts: it resumes; a suspended one does not.

        A price learned beside k sessions has co-location in it already, so at that k the curve adds
        nothing (scaling it by the curve's whole slowdown counted co-location twice: sixteen sessions
        priced at 1.36-1.42 of the device while it measured 0.76, `bench.c1_periods` 2026-12-03 17:06); a
        burst just admitted is priced at the curve's slope from there, so the report is what admission's
        marginal prices summed to."""
        counted = self._counted()
        return sum(self.costs.price(t.shape, t.ladder[0], len(counted)) / t.period_s for t in counted)

    def held_fraction(self) -> float:
        """Share of device time the periodic sessions suspended with their share held (`Session.holds_share`:
        re-queued for the room they left) would take back, priced as `busy_fraction` prices the others."""
        held = [t for t in self.sched.tasks.values() if t.cls in PERIODIC and t.sid in self._holding()]
        k = len(self._counted()) + len(held)
        return sum(self.costs.price(t.shape, t.ladder[0], k) / t.period_s for t in held)

    def _holding(self) -> set[str]:
        return {s.sid for s in self.sessions if s.status == "suspended" and s.holds_share}

    def _counted(self) -> list:
        """The periodic sessions the device's load counts: every one not suspended."""
        suspended = {s.sid for s in self.sessions if s.status == "suspended"}
        return [t for t in self.sched.tasks.values() if t.cls in PERIODIC and t.sid not in suspended]

    def measured_sessions(self) -> int:
        """How many of the sessions it holds the host's prices were measured beside: all of them but the
        periodic ones its last learned quantum did not have beside it yet (one that just arrived has run no
        block). Suspended and windowless sessions are priced at nothing, so they count as measured.
        Admission grows a device past this only step by step (`services/admission/ramp.py`)."""
        counted = len(self._counted())
        return len(self.sessions) - max(0, counted - self.costs.learned_beside)

    def measured_fraction(self) -> float:
        """Share of wall time this host's stages measured themselves running, over the last few seconds."""
        return self.sink.device_time.fraction(self.clock())

    def served_fraction(self) -> float:
        """Share of device time the periodic sessions take at the tiers they are served at now."""
        return self.sched.load()

    def refreshed_profile(self, rows: list[ProfileRow]) -> list[ProfileRow]:
        """The start-up rows with each block's cost as serving has measured it since (`CostModel.price`
        of a lone block, default config): admission prices the next session at today's cost. The whole row
        scales by it, up or down (the device runs every concurrency that much slower or faster than
        start-up found): the share start-up measured for the denoise stage is kept (placement's latency
        model reads `block_ms − quantum_ms`), and so is the co-location curve's shape."""
        out = []
        for r in rows:
            lone = self.costs.price(shape_of(self.backend(r.backend)), r.tier, 1) * 1000
            if lone <= 0 or r.block_ms <= 0 or lone == r.block_ms:
                out.append(r)
                continue
            ratio = lone / r.block_ms
            out.append(msgspec.structs.replace(r, quantum_ms=r.quantum_ms * ratio, block_ms=r.block_ms * ratio,
                                               colocated=[ms * ratio for ms in r.colocated]))
        return out

    def backend_infos(self) -> list[BackendInfo]:
        """Every backend this host can serve (builds each default config: call it off the loop)."""
        return [backend_info(self.backend(n), self.backends.registry.sources[n]) for n in self.served_backends()]

    def served_backends(self) -> list[str]:
        """Every registered backend, less those that serve only when this host's config names them
        (`opt_in`: a backend whose weights a user gives, such as `wan_causal`) and are not named."""
        reg = self.backends.registry
        return [n for n in reg.names() if n in self.backends.configs or not getattr(reg.load(n), "opt_in", False)]

    def state_bytes_resident(self) -> int:
        return sum(tree_bytes(s.state) for s in self.sessions if s.status != "suspended")

    def status(self) -> HostStatus:
        sids = self.sessions.ids()
        return HostStatus(host_id=self.host_id, device=str(self.device), sessions=[self.info(x) for x in sids],
                          metrics=[self.metrics(x) for x in sids], pipeline=self.pipeline.counters,
                          busy_fraction=self.busy_fraction(), state_bytes_resident=self.state_bytes_resident())

    # ------------------------------------------------------------ the mover's host endpoint

    def block_boundary(self, session_id: str) -> AbstractAsyncContextManager[None]:
        """While held, no block of the session runs (the one in flight, if any, finishes first)."""
        return self.boundaries.hold(self.sessions.get(session_id))

    def state_tree(self, session_id: str) -> dict:
        return self.endpoint.state_tree(session_id)

    def session_descriptor(self, session_id: str) -> bytes:
        return self.endpoint.session_descriptor(session_id)

    async def install_state(self, session_id: str, tree: dict, descriptor: bytes) -> None:
        await self.endpoint.install_state(session_id, tree, descriptor, gated=self.gate_moved_in)

    async def drop_session(self, session_id: str) -> None:
        await self.endpoint.drop_session(session_id)


async def _after(earlier: Outbox, publish: PublishBlock, *args: Any) -> None:
    await earlier.flushed()  # it takes no block once the journal is attached: at once after the first
    await publish(*args)
