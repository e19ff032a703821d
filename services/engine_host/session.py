"""One session on an engine host, the host's table of them, and the rules for its input order.

A session's inputs are applied in `seq` order exactly once: a duplicate or a gap is a `Conflict`
and changes nothing; every accepted item waits in `pending` until a block takes it. An item the
backend refuses (`BadRequest` from `parse_input`) is skipped: it takes its seq, so input order and
every later item stand, changes no state, and is counted and reported (`Rejected`), never
stopping the session or whoever serves it next.
"""

from __future__ import annotations

import asyncio
import re
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from libs.checkpoint import tree_bytes
from libs.errors import BadRequest, Busy, Conflict, NotFound
from libs.schemas.common import InputItem
from libs.schemas.engine import OpenSession, SessionDescriptor, SessionInfo
from services.engine_host.backends import Backend
from services.engine_host.metrics import SessionStats
from services.engine_host.playout import Playout
from services.engine_host.scheduler import Task

if TYPE_CHECKING:
    from services.engine_host.journal import OutputJournal
    from services.engine_host.outbox import Outbox

SID_RE = re.compile(r"[A-Za-z0-9_-]{1,128}")  # session ids become NATS subject tokens: fullmatch only
# Items accepted and waiting for a block. Fence's owner credit keeps this at its max_unapplied_items
# (256) except behind a `clear`, which is released at once with every item stored before it (up to
# max_pending_items, 1024, more): the bound is above both, so a clear is never held behind it and is
# applied by the next block, with everything before it (#26). Only a fence configured past it, or a
# bug, meets it (Busy: the lease waits for a block to take the queue).
MAX_PENDING_INPUTS = 2048
MAX_FAILED_KEPT = 256  # why recently failed sessions went, for their status; older reasons are dropped

SessionStatus = Literal["running", "suspended", "closing", "failed"]
# "moved": installed by a committed move, waiting for fence to assign it here
Origin = Literal["opened", "moved"]


@dataclass
class Pending:
    """An accepted input item waiting for a block: as released, as the backend parsed it, and when."""

    item: InputItem
    parsed: Any  # the backend's own value for it (see Backend.parse_input)
    accepted_at: float


@dataclass(frozen=True)
class Rejected:
    """An input item the session's backend refused: skipped, with the typed error that says why."""

    seq: int
    error: BadRequest


@dataclass
class Session:
    spec: OpenSession
    backend: Backend
    shape: str
    state: dict
    stats: SessionStats
    status: SessionStatus = "running"
    input_cursor: int = 0
    consumed_seq: int = 0
    pending: list[Pending] = field(default_factory=list)
    blocks_done: int = 0
    target_blocks: int = 0
    pipe_seq: int = -1
    busy: bool = False
    idle: asyncio.Event = field(default_factory=asyncio.Event)
    holds: int = 0
    held_at: float = 0.0
    suspended_at: float = 0.0
    # Suspended with its device share held (a C1 overload relief shed as `capacity_lost`): its heartbeat's
    # `held_fraction` prices it, so admission gives nothing new the room it waits to come back to.
    holds_share: bool = False
    asked_at: float = 0.0
    last_end: float = 0.0
    waiters: list[tuple[int, asyncio.Future[None]]] = field(default_factory=list)
    checkpoint_key: str = ""
    origin: Origin = "opened"
    # Installed by a move, gated until its first claim here: that claim's assignment takes this hold over.
    install_gated: bool = False
    rejected_inputs: int = 0
    last_rejected: Rejected | None = None
    journal: OutputJournal | None = None  # a fenced session's output gate (see journal.py)
    outbox: Outbox | None = None  # an unfenced one's ordered output (see outbox.py), made at its first output
    playout: Playout | None = None  # a C1 session's output pacing (see playout.py)
    threads: int = 1  # torch intra-op threads its blocks run at (lifecycle.session_threads)

    @property
    def sid(self) -> str:
        return self.spec.session_id

    def info(self, task: Task | None) -> SessionInfo:
        s = self.spec
        return SessionInfo(session_id=s.session_id, backend=s.backend, state=self.status,
                           session_class=s.session_class, tier=task.tier if task else s.tier,
                           blocks_done=self.blocks_done, input_cursor=self.input_cursor,
                           consumed_seq=self.consumed_seq, state_bytes=tree_bytes(self.state),
                           skipped_blocks=task.skipped if task else 0, rejected_inputs=self.rejected_inputs,
                           last_rejected_seq=self.last_rejected.seq if self.last_rejected else 0,
                           last_rejected_detail=self.last_rejected.error.detail if self.last_rejected else "",
                           threads=s.threads)

    def accept(self, item: InputItem, now: float) -> int | Rejected:
        """Queue one released input item, in seq order; returns the new input cursor, or the
        `Rejected` record of an item the backend refused (skipped: the cursor moved past it)."""
        sid = self.sid
        if self.status not in ("running", "suspended"):
            raise Conflict(f"session {sid} is {self.status}", session_id=sid)
        if item.seq <= self.input_cursor:
            raise Conflict(f"input {item.seq} is a duplicate (cursor {self.input_cursor})",
                           session_id=sid, seq=item.seq, cursor=self.input_cursor, reason="duplicate")
        if item.seq != self.input_cursor + 1:
            raise Conflict(f"input {item.seq} leaves a gap after {self.input_cursor}",
                           session_id=sid, seq=item.seq, cursor=self.input_cursor, reason="gap")
        if len(self.pending) >= MAX_PENDING_INPUTS:
            raise Busy(f"session {sid} has {MAX_PENDING_INPUTS} inputs waiting for a block", session_id=sid)
        try:
            parsed = self.backend.parse_input(item)
        except BadRequest as e:
            self.input_cursor = item.seq
            self.rejected_inputs += 1
            self.last_rejected = Rejected(item.seq, e)
            return self.last_rejected
        self.pending.append(Pending(item, parsed, now))
        self.input_cursor = item.seq
        return self.input_cursor

    def take_pending(self) -> list[Pending]:
        taken, self.pending = self.pending, []
        return taken

    def take_through(self, seq: int) -> list[Pending]:
        """The waiting items up to `seq` (a regenerated block takes exactly what it took the first time)."""
        n = sum(1 for p in self.pending if p.item.seq <= seq)
        taken, self.pending = self.pending[:n], self.pending[n:]
        return taken

    def take_progress(self, d: SessionDescriptor, pending: list[Pending]) -> None:
        """Adopt the progress a descriptor records (a moved or restored session)."""
        self.blocks_done, self.target_blocks = d.blocks_done, d.blocks_done
        self.input_cursor, self.consumed_seq, self.pending = d.input_cursor, d.consumed_seq, pending

    # "At most one block in flight" lives in the three methods below (and `__post_init__`): `busy` and
    # `idle` are written nowhere else. `idle` is set exactly while no block of the session is in flight.

    def __post_init__(self) -> None:
        if not self.busy:
            self.idle.set()

    def block_started(self) -> int:
        """A block of it goes into the pipeline: the pipeline sequence number it runs under."""
        self.busy = True
        self.idle.clear()
        self.pipe_seq += 1
        return self.pipe_seq

    def no_block_left(self, status: SessionStatus | None = None) -> None:
        """None of its blocks will reach the sink (cancelled by a close, or the session failed); `status`,
        when given, is what it becomes."""
        if status is not None:
            self.status = status
        self.busy = False
        self.idle.set()

    def block_finished(self, now: float) -> None:
        """No block of it is in flight any more: wake boundary holders and the advances it satisfied."""
        self.no_block_left()
        self.last_end = now
        still = []
        for target, fut in self.waiters:
            if self.blocks_done >= target:
                if not fut.done():
                    fut.set_result(None)
            else:
                still.append((target, fut))
        self.waiters = still

    def fail_waiters(self, error: Exception) -> None:
        for _, fut in self.waiters:
            if not fut.done():
                fut.set_exception(error)
        self.waiters = []


class SessionTable:
    """The sessions a host holds, by id, and why recently failed ones went."""

    def __init__(self, host_id: str) -> None:
        self.host_id = host_id
        self._by_id: dict[str, Session] = {}
        self.failed: OrderedDict[str, str] = OrderedDict()

    def get(self, sid: str) -> Session:
        """The live session; NotFound if there is none (a failed session is being released: it is gone)."""
        s = self._by_id.get(sid)
        if s is None or s.status == "failed":
            why = f" (failed: {self.failed[sid]})" if sid in self.failed else ""
            raise NotFound(f"session {sid} is not on host {self.host_id}{why}", session_id=sid,
                           host_id=self.host_id)
        return s

    def lookup(self, sid: str) -> Session | None:
        return self._by_id.get(sid)

    def add(self, s: Session) -> None:
        self._by_id[s.sid] = s
        self.failed.pop(s.sid, None)

    def remove(self, sid: str) -> None:
        self._by_id.pop(sid, None)

    def note_failed(self, sid: str, why: str) -> None:
        self.failed[sid] = why
        self.failed.move_to_end(sid)
        while len(self.failed) > MAX_FAILED_KEPT:
            self.failed.popitem(last=False)

    def __contains__(self, sid: object) -> bool:
        return sid in self._by_id

    def __len__(self) -> int:
        return len(self._by_id)

    def __iter__(self) -> Iterator[Session]:
        return iter(list(self._by_id.values()))

    def ids(self) -> list[str]:
        return sorted(self._by_id)
