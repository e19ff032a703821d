"""The placement service's fleet, as the pure policies read it (`policy.Fleet`). Pure: no I/O, clock passed in.

Hosts come from live heartbeats and their `sf_capacity` records (lifecycle state, and the
reservations their heartbeat cannot show yet); sessions from each host's own session list,
counted only on the host the `sf_sessions` hint says owns them (a copy left behind by a move
or a hand-over is not the session). What no message carries, the controller remembers in an
`Activity`: when each session last took input, when it was suspended, when it last moved.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from libs.contracts import Contract, floor_row
from libs.schemas.admission import SessionRecord
from libs.schemas.common import EngineEntry, ShedKind
from libs.schemas.engine import SessionInfo
from libs.schemas.placement import HostRecord
from services.placement import capacity
from services.placement.policy import Fleet, Host, PathRates, Session, SessionState


@dataclass(slots=True)
class Seen:
    cursor: int
    last_input_at: float
    suspended_at: float = 0.0
    moves: list[float] = field(default_factory=list)


class Activity:
    """Per session: the input cursor last seen and when it moved, suspensions and moves (controller clock)."""

    def __init__(self) -> None:
        self.seen: dict[str, Seen] = {}

    def observe(self, info: SessionInfo, now: float) -> Seen:
        s = self.seen.get(info.session_id)
        if s is None:  # first sight counts as activity: a session is never suspended before keep-warm has passed
            s = self.seen[info.session_id] = Seen(cursor=info.input_cursor, last_input_at=now)
        elif info.input_cursor != s.cursor:
            s.cursor, s.last_input_at = info.input_cursor, now
        if info.state == "suspended" and not s.suspended_at:
            s.suspended_at = now  # suspended by someone else (an operator): input after now resumes it
        elif info.state == "running":
            s.suspended_at = 0.0
        return s

    def suspended(self, sid: str, now: float) -> None:
        if sid in self.seen:
            self.seen[sid].suspended_at = now

    def moved(self, sid: str, now: float, window_s: float) -> None:
        if sid in self.seen:
            s = self.seen[sid]
            s.moves = [t for t in s.moves if now - t < window_s] + [now]

    def forget_except(self, live: set[str]) -> None:
        for sid in [sid for sid in self.seen if sid not in live]:
            del self.seen[sid]


class Arrivals:
    """New sessions per second over the last `window_s`, as they appear in the sessions hint.

    The first look counts none: a new tenure holder finds a fleet already there, not a burst."""

    def __init__(self) -> None:
        self.known: set[str] | None = None
        self.times: deque[float] = deque()

    def rate(self, session_ids: Iterable[str], now: float, window_s: float) -> float:
        ids = set(session_ids)
        if self.known is not None:
            self.times.extend(now for _ in ids - self.known)
        self.known = ids
        while self.times and self.times[0] <= now - window_s:
            self.times.popleft()
        return len(self.times) / window_s


@dataclass(frozen=True, slots=True)
class Inputs:
    """Everything one snapshot is built from, as the service's caches hold it at one instant."""

    now: float  # the controller's clock (monotonic): activity times are on it
    wall_now: float  # heartbeats and reservations carry wall-clock times
    entries: list[EngineEntry]  # live hosts
    records: Mapping[str, HostRecord]
    sessions: Mapping[str, list[SessionInfo]]  # host → what it holds
    owners: Mapping[str, str]  # session → the host the sessions hint says owns it
    specs: Mapping[str, tuple[Contract, str]]  # session → (contract, backend)
    busy: Mapping[str, tuple[str, str]]  # session → (from, to) of a move, suspend or resume in flight
    path_bps: float  # the rate of a path no move has crossed yet
    settle_s: float
    provisioning: int = 0
    arrivals_per_s: float = 0.0
    last_scale_out_at: float = float("-inf")
    last_scale_in_at: float = float("-inf")
    path_pairs: Mapping[str, float] = field(default_factory=dict)  # "src>dst" → measured bytes/s
    admissions: Sequence[SessionRecord] = ()  # admission's records: its queue is sessions no host fits yet
    shed: Mapping[str, ShedKind] = field(default_factory=dict)  # session → why overload relief suspended it (the hint's mark)


def snapshot(x: Inputs, activity: Activity) -> Fleet:
    moves_in: dict[str, int] = {}
    for src, dst in x.busy.values():
        if dst != src:
            moves_in[dst] = moves_in.get(dst, 0) + 1
    hosts = tuple(_host(e, x, moves_in.get(e.host_id, 0)) for e in sorted(x.entries, key=lambda e: e.host_id))
    by_id = {e.host_id: e for e in x.entries}
    sessions = []
    for host_id, infos in sorted(x.sessions.items()):
        entry = by_id.get(host_id)
        if entry is None:
            continue
        for info in infos:
            if info.state not in ("running", "suspended") or x.owners.get(info.session_id) != host_id:
                continue
            seen = activity.observe(info, x.now)
            spec = x.specs.get(info.session_id)
            if spec is not None:
                sessions.append(_session(info, seen, spec, entry, x))
    queue = sorted((r for r in x.admissions if r.state == "queued"), key=lambda r: (r.created_at, r.session_id))
    sessions += [_queued(r, x.now) for r in queue]
    return Fleet(now=x.now, hosts=hosts, sessions=tuple(sessions), paths=PathRates(default_bps=x.path_bps, pairs=dict(x.path_pairs)),
                 provisioning=x.provisioning, arrivals_per_s=x.arrivals_per_s, last_scale_out_at=x.last_scale_out_at,
                 last_scale_in_at=x.last_scale_in_at)


def _host(e: EngineEntry, x: Inputs, moves_in: int) -> Host:
    record = x.records.get(e.host_id)
    return Host(entry=e, state=record.state if record else "up", moves_in=moves_in,
                reserved=tuple(capacity.pending(record, e, x.settle_s)))


def _session(info: SessionInfo, seen: Seen, spec: tuple[Contract, str], entry: EngineEntry, x: Inputs) -> Session:
    contract, backend = spec
    state: SessionState = "moving" if info.session_id in x.busy else (
        "suspended" if info.state == "suspended" else "serving")
    return Session(session_id=info.session_id, backend=backend, contract=contract, state=state,
                   host_id=entry.host_id, state_bytes=info.state_bytes,
                   dirty_rate_bps=dirty_rate_bps(contract, backend, entry), last_input_at=seen.last_input_at,
                   suspended_at=seen.suspended_at, moves=tuple(seen.moves), threads=info.threads,
                   shed=x.shed.get(info.session_id, "") if state == "suspended" else "")


def _queued(r: SessionRecord, now: float) -> Session:
    """A session admission queues: the policies try to place it (admission places it itself once a host
    fits), and what still fits nowhere makes the autoscaler ask for hosts."""
    state_bytes = max((e.state_bytes for e in r.verdict.estimates), default=0)
    return Session(session_id=r.session_id, backend=r.backend, contract=r.contract, state="queued",
                   state_bytes=state_bytes, last_input_at=now)


def dirty_rate_bps(contract: Contract, backend: str, entry: EngineEntry) -> float:
    """Bytes a block rewrites (the host's measured profile row) times blocks per second: one block every
    release period (C1's period; a C2 deadline over its blocks per window), back to back for classes
    released only when asked."""
    row = floor_row(entry.profile, backend, contract.quality_floor)
    if row is None or not row.dirty_bytes_per_block:
        return 0.0
    period_ms = contract.release_period_ms or row.block_ms
    return row.dirty_bytes_per_block * 1e3 / period_ms if period_ms else 0.0
