"""The mover's view of an engine host: a session's state tree and descriptor, installing a moved
tree (checked against the backend before anything changes) and dropping the source copy."""

from __future__ import annotations

from collections.abc import Callable

import torch

from libs.checkpoint.tree import split
from libs.errors import BadRequest, Conflict
from libs.schemas.base import decode, encode
from libs.schemas.engine import OpenSession, SessionDescriptor
from services.engine_host.backends import Backend
from services.engine_host.boundary import Boundaries
from services.engine_host.costs import Backends, shape_of
from services.engine_host.lifecycle import Lifecycle
from services.engine_host.scheduler import Task
from services.engine_host.session import SID_RE, Pending, Session, SessionTable


def describe(s: Session, task: Task | None, *, with_pending: bool) -> SessionDescriptor:
    """What recreates the session elsewhere with its state tree. Without pending inputs (a checkpoint)
    the input cursor is the consumed one: what was still waiting is released again from there."""
    sp = s.spec
    return SessionDescriptor(
        session_id=s.sid, backend=sp.backend, seed=sp.seed, prompt=sp.prompt,
        tier=task.tier if task else sp.tier, quality_floor=sp.quality_floor, session_class=sp.session_class,
        period_ms=sp.period_ms, determinism=sp.determinism, backend_config=s.backend.config_bytes(),
        blocks_done=s.blocks_done,
        input_cursor=s.input_cursor if with_pending else s.consumed_seq, consumed_seq=s.consumed_seq,
        pending=[p.item for p in s.pending] if with_pending else [])


class HostEndpoint:
    def __init__(self, sessions: SessionTable, backends: Backends, lifecycle: Lifecycle, boundaries: Boundaries,
                 tasks: Callable[[str], Task | None], *, clock: Callable[[], float]) -> None:
        self.sessions = sessions
        self.backends = backends
        self.lifecycle = lifecycle
        self.boundaries = boundaries
        self.tasks = tasks
        self.clock = clock

    def state_tree(self, session_id: str) -> dict:
        return self.sessions.get(session_id).state

    def session_descriptor(self, session_id: str) -> bytes:
        s = self.sessions.get(session_id)
        return encode(describe(s, self.tasks(session_id), with_pending=True))

    async def install_state(self, session_id: str, tree: dict, descriptor: bytes, *, gated: bool = False) -> Session:
        """Make `tree` (already on this device) the session's live state, creating the session if
        this host does not hold it (gated: running no block until ungated). Nothing changes unless
        tree and descriptor both check out."""
        d = decode(descriptor, SessionDescriptor)
        if d.session_id != session_id:
            raise BadRequest(f"descriptor is for {d.session_id}, not {session_id}", session_id=session_id)
        backend = self.backends.get(d.backend, d.backend_config)
        check_tree(session_id, backend, tree, self.backends.device)
        pending = [Pending(item, backend.parse_input(item), self.clock()) for item in d.pending]
        s = self.sessions.lookup(session_id)
        if s is None:
            spec = OpenSession(session_id=session_id, backend=d.backend, seed=d.seed, prompt=d.prompt, tier=d.tier,
                               quality_floor=d.quality_floor, session_class=d.session_class,
                               period_ms=d.period_ms, determinism=d.determinism)
            if not SID_RE.match(session_id):
                raise BadRequest(f"session id must match {SID_RE.pattern}", session_id=session_id)
            s = await self.lifecycle.admit(spec, backend, tree, gated=gated)
            s.origin = "moved"
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
        await self.lifecycle.close(session_id, drain=False)


def check_tree(sid: str, backend: Backend, tree: dict, device: torch.device) -> None:
    """A typed BadRequest unless `tree` has exactly the backend's leaves, of its dtypes and shapes, on `device`."""
    spec = backend.state_spec()
    if not isinstance(tree, dict) or set(tree) != set(spec):
        raise BadRequest(f"state tree keys do not match the {backend.name} backend", session_id=sid)
    for key, want in spec.items():
        v = tree[key]
        if isinstance(want, tuple):
            ok = (isinstance(v, torch.Tensor) and v.dtype == want[0] and tuple(v.shape) == want[1]
                  and v.device == device)
        else:
            ok = type(v) is want
        if not ok:
            raise BadRequest(f"state leaf {key} does not match the {backend.name} backend on {device}",
                             session_id=sid, leaf=key)
    split(tree)  # rejects anything that is not a tensor or scalar
