"""Sessions coming and going: open (validated), admit, ordered close, and failing one whose block raised.

A session whose block raises is failed and closed in order (its pipeline slots released); the
host and its other sessions go on.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import structlog

from libs import init_inputs
from libs.errors import BadRequest, Busy, Conflict
from libs.schemas.engine import OpenSession, SessionInfo
from libs.session_classes import PERIODIC, DeterminismTier, coalescable
from services.engine_host import torch_threads
from services.engine_host.backends import Backend
from services.engine_host.backends.base import init_kinds, max_init_bytes, paced_output
from services.engine_host.costs import Backends, shape_of
from services.engine_host.metrics import SessionStats
from services.engine_host.pipeline import StagePipeline
from services.engine_host.playout import Playout
from services.engine_host.scheduler import Dispatch, EdfScheduler, Task
from services.engine_host.session import SID_RE, Session, SessionTable
from services.engine_host.stages import BlockJob

log = structlog.get_logger("statefleet.engine_host.lifecycle")

InThread = Callable[..., Awaitable[Any]]
JOURNAL_FINISH_S = 5.0  # a finishing close waits this long for the journal (the bus may be away)


def session_threads(determinism: DeterminismTier, recorded: int, host: int) -> int:
    """The torch intra-op threads a session's blocks run at on this host: a T0/T1 session's recorded
    count, or this host's at its first open (its bytes depend on the count: MKL's GEMM rounds otherwise
    at 1 thread than at 2); a T2 session's, this host's (it promises no bits)."""
    if coalescable(determinism):
        return host
    return recorded or host


def pinned_spec(spec: OpenSession, host: int) -> OpenSession:
    """`spec` recording the count a T0/T1 session is pinned to (0 for T2: each host its own)."""
    threads = 0 if coalescable(spec.determinism) else spec.threads or host
    return spec if threads == spec.threads else msgspec.structs.replace(spec, threads=threads)


class Lifecycle:
    def __init__(self, sessions: SessionTable, backends: Backends, sched: EdfScheduler,
                 pipeline: StagePipeline[BlockJob, Dispatch], *, max_sessions: int, in_thread: InThread,
                 clock: Callable[[], float], wake: Callable[[], None], gate: Callable[[Session], None],
                 c1_pacing: bool = True, threads: int = 1) -> None:
        self.sessions = sessions
        self.threads = threads  # this host's torch intra-op threads
        self.backends = backends
        self.sched = sched
        self.pipeline = pipeline
        self.max_sessions = max_sessions
        self.in_thread = in_thread
        self.clock = clock
        self.wake = wake
        self.gate = gate
        self.c1_pacing = c1_pacing
        self._background: set[asyncio.Task[None]] = set()

    def validate_open(self, spec: OpenSession) -> Backend:
        if not SID_RE.fullmatch(spec.session_id):
            raise BadRequest(f"session id must match {SID_RE.pattern}", session_id=spec.session_id)
        host = self.sessions.host_id
        if spec.session_id in self.sessions:
            raise Conflict(f"session {spec.session_id} is already open on {host}", session_id=spec.session_id)
        if len(self.sessions) >= self.max_sessions:
            raise Busy(f"host {host} holds its maximum of {self.max_sessions} sessions", host_id=host)
        backend = self.backends.get(spec.backend)
        for name, tier in (("tier", spec.tier), ("quality_floor", spec.quality_floor)):
            if tier and tier not in backend.tiers:
                raise BadRequest(f"{name} {tier} is not one of {spec.backend}'s tiers {backend.tiers}",
                                 session_id=spec.session_id)
        if spec.tier and spec.quality_floor > spec.tier:
            raise BadRequest("quality_floor is above the requested tier", session_id=spec.session_id)
        init_inputs.check(spec.prompt, spec.image, spec.audio, kinds=init_kinds(backend),
                          max_bytes=max_init_bytes(backend), backend=spec.backend, session_id=spec.session_id)
        periodic = spec.session_class in PERIODIC
        if periodic != (spec.period_ms > 0) or not math.isfinite(spec.period_ms):
            raise BadRequest(f"{spec.session_class} sessions {'need' if periodic else 'take no'} period_ms",
                             session_id=spec.session_id)
        return backend

    async def open(self, spec: OpenSession, *, gated: bool = False) -> Session:
        backend = self.validate_open(spec)
        spec = pinned_spec(spec, self.threads)
        threads = session_threads(spec.determinism, spec.threads, self.threads)
        state = await self.in_thread(torch_threads.pinned(threads, backend.init_state), spec.seed, spec.init())
        return await self.admit(spec, backend, state, gated=gated)

    async def admit(self, spec: OpenSession, backend: Backend, state: dict, *, gated: bool = False) -> Session:
        """Make a session of `state` live: a pipeline slot in every stage, then a scheduler task.
        A gated session runs no block until the caller ungates it (a fenced host first learns
        which blocks it must regenerate)."""
        now = self.clock()
        spec = pinned_spec(spec, self.threads)
        s = Session(spec=spec, backend=backend, shape=shape_of(backend), state=state,
                    stats=SessionStats(spec.session_id, spec.backend, backend.media_s_per_block, now),
                    last_end=now, threads=session_threads(spec.determinism, spec.threads, self.threads))
        if spec.session_class == "C1" and self.c1_pacing and paced_output(backend):
            s.playout = Playout(spec.period_ms / 1000)
        await self.pipeline.open(spec.session_id)
        ladder = tuple(t for t in backend.tiers if t >= (spec.quality_floor or backend.tiers[0]))
        self.sched.add(Task(sid=spec.session_id, cls=spec.session_class, shape=s.shape, ladder=ladder,
                            tier=spec.tier or ladder[-1], period_s=spec.period_ms / 1000,
                            batchable=backend.batchable and coalescable(spec.determinism)), now)
        self.sessions.add(s)
        if gated:
            self.gate(s)
        self.wake()
        return s

    async def close(self, sid: str, *, finish: bool) -> SessionInfo:
        """Ordered shutdown of one session: stop scheduling it, let its block finish or cancel it, release
        its pipeline slots last stage first, verify none is left."""
        s = self.sessions.get(sid)
        info = s.info(self.sched.tasks.get(sid))
        s.status = "closing"
        self.sched.remove(sid)
        try:
            await self.pipeline.close(sid, finish=finish)
        finally:
            self.sessions.remove(sid)
            s.fail_waiters(Conflict(f"session {sid} was closed", session_id=sid))
            # No block of it is left: a cancelled one never reaches the sink, so a hold waiting
            # for it to end would otherwise wait forever.
            s.no_block_left()
            self.wake()
            await self._end_output(s, finish=finish)
        return SessionInfo(**{**{f: getattr(info, f) for f in info.__struct_fields__}, "state": "closed"})

    def fail(self, s: Session, error: BaseException) -> None:
        """A block raised: fail the session and close it in order; the host goes on."""
        log.warning("session_failed", session_id=s.sid, error=repr(error))
        self.sessions.note_failed(s.sid, repr(error))
        s.no_block_left("failed")
        self.sched.remove(s.sid)
        s.fail_waiters(Conflict(f"session {s.sid} failed: {error!r}", session_id=s.sid))
        task = asyncio.create_task(self._close_failed(s.sid))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _close_failed(self, sid: str) -> None:
        try:
            await self.pipeline.close(sid, finish=False)
        except Exception as e:
            log.error("failed_session_cleanup_failed", session_id=sid, error=repr(e))
        finally:
            s = self.sessions.lookup(sid)
            self.sessions.remove(sid)
            if s is not None:
                await self._end_output(s, finish=False)

    @staticmethod
    async def _end_output(s: Session, *, finish: bool) -> None:
        """A closing session's journal and outbox: their waiting blocks go out first (the outbox's always:
        its blocks are done and need nothing but the encode; the journal's when finishing), then their
        tasks end."""
        queues, s.outbox, s.journal = ((s.outbox, True), (s.journal, finish)), None, None
        for queue, flush in queues:
            if queue is None:
                continue
            if flush:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(queue.flushed(), JOURNAL_FINISH_S)
            await queue.close()

    async def settle(self) -> None:
        """Wait for failed sessions' cleanups still running."""
        await asyncio.gather(*self._background, return_exceptions=True)
