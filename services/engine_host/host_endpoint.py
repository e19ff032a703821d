"""The mover's view of an engine host: a session's state tree and descriptor, installing a moved
tree (checked against the backend before anything changes) and dropping the source copy.

The tree the mover sees holds only the leaves of role `moved` (and every scalar): a manifest,
a pre-copy round and a checkpoint count and carry those alone. Installing one grafts it onto a
fresh `init_state` tree (which regenerates `static` leaves from the seed and init inputs) and
calls the backend's `rebuild` for `rebuildable` leaves, unless the source sent those too because
it measured a rebuild dearer than their bytes (`rebuild_choice`)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import torch

from libs import init_inputs
from libs.errors import BadRequest, Conflict
from libs.schemas.base import decode, encode
from libs.schemas.common import BackendInfo
from libs.schemas.engine import OpenSession, SessionDescriptor, SessionInit
from services.engine_host import torch_threads
from services.engine_host.backends import Backend
from services.engine_host.backends import spec as specs
from services.engine_host.backends.base import init_kinds, max_init_bytes
from services.engine_host.boundary import Boundaries
from services.engine_host.costs import Backends, shape_of
from services.engine_host.lifecycle import Lifecycle, session_threads
from services.engine_host.rebuild_choice import MOVED, WITH_REBUILDABLE, RebuildChoice
from services.engine_host.scheduler import Task
from services.engine_host.session import SID_RE, Pending, Session, SessionTable


def describe(s: Session, task: Task | None, *, with_pending: bool,
             sent_roles: tuple[specs.Role, ...] = MOVED) -> SessionDescriptor:
    """What recreates the session elsewhere with its state tree (of `sent_roles`). Without pending
    inputs (a checkpoint) the input cursor is the consumed one: what was still waiting is released
    again from there."""
    sp = s.spec
    return SessionDescriptor(
        session_id=s.sid, backend=sp.backend, seed=sp.seed, prompt=sp.prompt,
        tier=task.tier if task else sp.tier, quality_floor=sp.quality_floor, session_class=sp.session_class,
        period_ms=sp.period_ms, determinism=sp.determinism, backend_config=s.backend.config_bytes(),
        blocks_done=s.blocks_done,
        input_cursor=s.input_cursor if with_pending else s.consumed_seq, consumed_seq=s.consumed_seq,
        pending=[p.item for p in s.pending] if with_pending else [], image=sp.image, audio=sp.audio,
        sent_roles=sent_roles, threads=sp.threads)


class HostEndpoint:
    def __init__(self, sessions: SessionTable, backends: Backends, lifecycle: Lifecycle, boundaries: Boundaries,
                 tasks: Callable[[str], Task | None], *, clock: Callable[[], float],
                 in_thread: Callable[..., Awaitable[Any]], rebuilds: RebuildChoice | None = None) -> None:
        self.sessions = sessions
        self.backends = backends
        self.lifecycle = lifecycle
        self.boundaries = boundaries
        self.tasks = tasks
        self.clock = clock
        self.in_thread = in_thread
        self.rebuilds = rebuilds or RebuildChoice()

    def state_tree(self, session_id: str) -> dict:
        """The part of the live tree a move sends: the same tensor objects, so a pre-copy round reads
        the live bytes."""
        s = self.sessions.get(session_id)
        return specs.select(s.state, s.backend.state_spec(), self.rebuilds.roles(s.backend))

    def session_descriptor(self, session_id: str) -> bytes:
        s = self.sessions.get(session_id)
        return encode(describe(s, self.tasks(session_id), with_pending=True,
                               sent_roles=self.rebuilds.roles(s.backend)))

    async def install_state(self, session_id: str, tree: dict, descriptor: bytes, *, gated: bool = False) -> Session:
        """Make `tree` (already on this device) the session's live state, creating the session if
        this host does not hold it (gated: running no block until ungated). Nothing changes unless
        tree and descriptor both check out."""
        d = decode(descriptor, SessionDescriptor)
        if d.session_id != session_id:
            raise BadRequest(f"descriptor is for {d.session_id}, not {session_id}", session_id=session_id)
        backend = self.backends.get(d.backend, d.backend_config)
        roles = sent_roles(session_id, d)
        init_inputs.check(d.prompt, d.image, d.audio, kinds=init_kinds(backend), max_bytes=max_init_bytes(backend),
                          backend=d.backend, session_id=session_id)
        check_tree(session_id, backend, tree, self.backends.device, roles)
        pending = [Pending(item, backend.parse_input(item), self.clock()) for item in d.pending]
        if not SID_RE.match(session_id):
            raise BadRequest(f"session id must match {SID_RE.pattern}", session_id=session_id)
        init = SessionInit(prompt=d.prompt, image=d.image, audio=d.audio)
        threads = session_threads(d.determinism, d.threads, self.lifecycle.threads)  # what rebuilt leaves derive at
        tree, rebuild_s = await self.in_thread(torch_threads.pinned(threads, complete), backend, tree, d.seed, init,
                                               roles)
        if rebuild_s is not None:
            self.rebuilds.observe(backend, rebuild_s)
        s = self.sessions.lookup(session_id)
        if s is None:
            spec = OpenSession(session_id=session_id, backend=d.backend, seed=d.seed, prompt=d.prompt, tier=d.tier,
                               quality_floor=d.quality_floor, session_class=d.session_class,
                               period_ms=d.period_ms, determinism=d.determinism, image=d.image, audio=d.audio,
                               threads=d.threads)
            if not SID_RE.fullmatch(session_id):
                raise BadRequest(f"session id must match {SID_RE.pattern}", session_id=session_id)
            s = await self.lifecycle.admit(spec, backend, tree, gated=gated)
            s.origin = "moved"
            s.install_gated = gated
            s.take_progress(d, pending)  # no await since admit: no block can have run yet
            return s
        if s.status != "running" or s.shape != shape_of(backend):
            raise Conflict(f"session {session_id} is {s.status} or of another shape", session_id=session_id)
        async with self.boundaries.hold(s):
            s.state = tree
            s.take_progress(d, pending)
        return s

    async def drop_session(self, session_id: str) -> None:
        """Release the source copy after a committed move (no more blocks, no output)."""
        await self.lifecycle.close(session_id, finish=False)


def sent_roles(sid: str, d: SessionDescriptor) -> tuple[specs.Role, ...]:
    for roles in (MOVED, WITH_REBUILDABLE):
        if tuple(d.sent_roles) == roles:
            return roles
    raise BadRequest(f"a moved tree carries the roles {list(MOVED)} or {list(WITH_REBUILDABLE)}, not "
                     f"{d.sent_roles}", session_id=sid)


def check_tree(sid: str, backend: Backend, tree: dict, device: torch.device,
               roles: tuple[specs.Role, ...] = MOVED) -> None:
    """A typed `StateLayoutError` (a BadRequest) naming the first leaf of a moved tree that does not
    match the backend's leaves of `roles`, of their dtypes and shapes, on `device`."""
    try:
        specs.check(tree, backend.state_spec(), device, roles=roles)
    except specs.StateLayoutError as e:
        raise specs.StateLayoutError(f"{e.detail} ({backend.name} backend)", session_id=sid, **e.fields) from None


def complete(backend: Backend, sent: dict, seed: int, init: SessionInit,
             roles: tuple[specs.Role, ...] = MOVED) -> tuple[dict, float | None]:
    """A whole live tree from the part a move sent (leaves of `roles`): `static` leaves regenerated
    by `init_state`, `rebuildable` ones, unless sent, re-derived by the backend's `rebuild`. Returns
    the tree and the seconds the rebuild took (None: none ran). Blocking: call it from a thread."""
    spec = backend.state_spec()
    if not specs.has_unmoved(spec):
        return sent, None
    tree = specs.graft(backend.init_state(seed, init), sent, spec, roles)
    if "rebuildable" in roles or not specs.tensor_bytes(spec, "rebuildable"):
        return tree, None
    t0 = time.perf_counter()
    backend.rebuild(tree)
    return tree, time.perf_counter() - t0


def backend_info(backend: Backend, source: str) -> BackendInfo:
    spec = backend.state_spec()
    return BackendInfo(name=backend.name, source=source, tiers=list(backend.tiers),
                       input_kinds=sorted(backend.input_kinds), init_kinds=sorted(init_kinds(backend)),
                       moved_bytes=specs.tensor_bytes(spec, "moved"),
                       rebuildable_bytes=specs.tensor_bytes(spec, "rebuildable"),
                       static_bytes=specs.tensor_bytes(spec, "static"))
