"""Fakes of placement's parts (`services/placement/parts.py`), in memory, for the controller's and the
drainer's unit tests: they hold what the real parts would have written, so a test asserts outcomes
(who owns a session, which reservations stand, which state a host record is in)."""

from __future__ import annotations

import msgspec
import structlog

from libs.contracts import Contract, Guard, estimate
from libs.errors import Conflict, NotFound, Rejected
from libs.schemas.admission import SessionRecord
from libs.schemas.common import EngineEntry, SessionSummary, ShedKind
from libs.schemas.engine import SessionInfo
from libs.schemas.fence import Owner, SessionView
from libs.schemas.placement import DrainReport, HostRecord, HostRequest, HostState, Reserved
from services.placement import capacity
from services.placement.config import PlacementConfig
from services.placement.controller import FleetController
from services.placement.drainer import Drainer
from services.placement.relocation import Relocation
from tests.support.fleet_rows import c1

GUARD = Guard(busy_fraction=0.1, memory_fraction=0.05, max_sessions=16)
LOG = structlog.get_logger("tests.placement.parts")


class View:
    def __init__(self, entries: list[EngineEntry], records: dict[str, HostRecord] | None = None) -> None:
        self.entries = {e.host_id: e for e in entries}
        self.host_records = records if records is not None else {}
        self.summary: dict[str, SessionSummary] = {}
        self.queue: list[SessionRecord] = []

    def live_hosts(self) -> list[EngineEntry]:
        return list(self.entries.values())

    def entry(self, host_id: str) -> EngineEntry | None:
        return self.entries.get(host_id)

    def is_live(self, host_id: str) -> bool:
        return host_id in self.entries

    def up_hosts(self) -> list[EngineEntry]:
        return [e for e in self.entries.values()
                if (r := self.host_records.get(e.host_id)) is None or r.state == "up"]

    def records(self) -> dict[str, HostRecord]:
        return self.host_records

    def summaries(self) -> dict[str, SessionSummary]:
        return self.summary

    def queued(self) -> list[SessionRecord]:
        return self.queue

    def owned(self, host_id: str) -> list[SessionSummary]:
        return [s for s in self.summary.values() if s.owner_server_id == host_id and s.state != "closed"]

    def host_of(self, session_id: str) -> str:
        s = self.summary.get(session_id)
        return s.owner_server_id if s else ""

    def check_known(self, host_id: str) -> None:
        if host_id not in self.entries and host_id not in self.host_records:
            raise NotFound(f"no engine host {host_id}", host_id=host_id)


class Owners:
    """Fence's log, one view per session; `assign` is the compare-and-set on the version."""

    def __init__(self, view: View) -> None:
        self.fleet = view
        self.views: dict[str, SessionView] = {}
        self.specs: dict[str, tuple[Contract, str]] = {}
        self.thread_counts: dict[str, int] = {}  # the block journal's count per session
        self.assigns: list[tuple[str, str, int]] = []
        self.marks: list[tuple[str, int, str]] = []

    def own(self, session_id: str, host_id: str, version: int = 1) -> None:
        """The session claimed by `host_id` at `version` (and the `sf_sessions` hint says so)."""
        owner = Owner(server_id=host_id, version=version)
        self.views[session_id] = SessionView(owner=owner, claim=owner)
        self.specs.setdefault(session_id, (c1(), "world"))
        self.fleet.summary[session_id] = SessionSummary(session_id=session_id, owner_server_id=host_id,
                                                        owner_version=version, claimed=True, state="serving")

    async def view(self, session_id: str) -> SessionView:
        return self.views[session_id]

    async def owner_is(self, session_id: str, host_id: str) -> bool:
        owner = self.views[session_id].owner
        return owner is not None and owner.server_id == host_id

    async def assign(self, session_id: str, host_id: str, *, expect_version: int, incarnation: str) -> None:
        owner = self.views[session_id].owner
        latest = owner.version if owner else 0
        if latest != expect_version:
            raise Conflict(f"session is at version {latest}, not {expect_version}", session_id=session_id)
        self.assigns.append((session_id, host_id, expect_version))
        self.own(session_id, host_id, latest + 1)

    async def spec(self, session_id: str) -> tuple[Contract, str]:
        return self.specs[session_id]

    async def threads(self, session_id: str) -> int:
        return self.thread_counts.get(session_id, 0)

    async def mark(self, session_id: str, version: int, orphaned: str = "", *, shed: str = "", shed_kind: ShedKind = "",
                   resumed: bool = False) -> None:
        """Fence's marks, as asked for; a shed one also as the hint then shows it."""
        self.marks.append((session_id, version, orphaned or shed or ("resumed" if resumed else "")))
        old = self.fleet.summary.get(session_id) or SessionSummary(session_id=session_id)
        if shed:
            self.fleet.summary[session_id] = msgspec.structs.replace(old, state="suspended", reason=shed,
                                                                     shed=shed_kind)
        elif resumed:
            self.fleet.summary[session_id] = msgspec.structs.replace(old, state="serving", reason="", shed="")


class Reservations:
    """The capacity bucket: one record per host, a revision bumped by every write."""

    def __init__(self, view: View, owners: Owners) -> None:
        self.view, self.owners = view, owners
        self.revisions: dict[str, int] = {}

    def _write(self, record: HostRecord) -> HostRecord:
        self.view.host_records[record.host_id] = record
        self.revisions[record.host_id] = self.revisions.get(record.host_id, 0) + 1
        return record

    def record(self, host_id: str) -> HostRecord:
        return self.view.host_records.get(host_id) or HostRecord(host_id=host_id)

    def holding(self, session_id: str) -> set[str]:
        return {h for h, r in self.view.host_records.items() if session_id in r.sessions}

    async def reserve(self, session_id: str, host_id: str, incarnation: str) -> HostRecord:
        contract, backend = await self.owners.spec(session_id)
        entry = self.view.entry(host_id)
        record = self.record(host_id)
        est = None if entry is None or record.state != "up" else \
            estimate(contract, backend, entry, capacity.pending(capacity.unreserve(record, [session_id]), entry, 6.0),
                     GUARD)
        if est is None or not est.fits:
            raise Rejected(f"host {host_id}: no room", reason="no_fit", host_id=host_id)
        return self._write(capacity.reserve(record, session_id, est, incarnation, 0.0))

    async def unreserve(self, host_id: str, session_ids: list[str]) -> None:
        self._write(capacity.unreserve(self.record(host_id), session_ids))

    async def set_state(self, host_id: str, state: HostState, *, only_from: HostState | None = None) -> HostRecord:
        record = self.record(host_id)
        if only_from is not None and record.state != only_from:
            return record
        return self._write(msgspec.structs.replace(record, state=state))

    async def given_out(self, host_id: str) -> None:
        self._write(msgspec.structs.replace(self.record(host_id), state="up", sessions={}))

    async def read(self, host_id: str) -> tuple[HostRecord, int]:
        return self.record(host_id), self.revisions.get(host_id, 0)

    async def fence_drained(self, record: HostRecord, revision: int) -> bool:
        if self.revisions.get(record.host_id, 0) != revision:
            return False
        self._write(msgspec.structs.replace(record, state="drained"))
        return True


class Relocation_(Relocation):
    """The real settling over the fakes; the mover's part is `commits`: which sessions a live move takes."""

    def __init__(self, owners: Owners, reservations: Reservations) -> None:
        super().__init__(nc=None, owners=owners, reservations=reservations, deadline_s=1.0)
        self.fake_owners = owners
        self.commits: set[str] = set()
        self.asked: list[tuple[str, str, str]] = []

    async def move(self, session_id: str, src: str, dst: str) -> str:
        self.asked.append((session_id, src, dst))
        if session_id not in self.commits:
            return "rolled_back: not admissible within the horizon"
        owner = self.fake_owners.views[session_id].owner
        self.fake_owners.own(session_id, dst, (owner.version if owner else 0) + 1)
        return "committed: "


class Engines:
    def __init__(self) -> None:
        self.sessions: dict[str, list[SessionInfo]] = {}
        self.suspended: list[tuple[str, str]] = []
        self.holding: list[str] = []  # suspended with their device share kept
        self.resumed: list[tuple[str, str]] = []

    async def statuses(self, host_ids: list[str]) -> dict[str, list[SessionInfo]]:
        return {h: self.sessions.get(h, []) for h in host_ids}

    async def suspend(self, host_id: str, session_id: str, hold_share: bool = False) -> None:
        self.suspended.append((host_id, session_id))
        self.holding += [session_id] if hold_share else []

    async def resume(self, host_id: str, session_id: str) -> None:
        self.resumed.append((host_id, session_id))


class Tenure:
    held = True

    async def renew(self) -> bool:
        return True

    async def give_up(self) -> None:
        pass


class DrainCalls:
    def __init__(self) -> None:
        self.hosts: list[str] = []

    async def drain(self, req: HostRequest) -> DrainReport:
        self.hosts.append(req.host_id)
        return DrainReport(host_id=req.host_id, state="drained")


class Parts:
    """Every fake, wired the way `PlacementService.setup` wires the real parts."""

    def __init__(self, entries: list[EngineEntry], **config: object) -> None:
        self.config = PlacementConfig(**config)
        self.view = View(entries)
        self.owners = Owners(self.view)
        self.reservations = Reservations(self.view, self.owners)
        self.relocation = Relocation_(self.owners, self.reservations)
        self.engines = Engines()
        self.drains = DrainCalls()

    def reserved(self, host_id: str, *session_ids: str) -> None:
        record = self.reservations.record(host_id)
        self.view.host_records[host_id] = msgspec.structs.replace(record, sessions={
            **record.sessions, **{s: Reserved(busy_fraction=0.1, state_bytes=1, at=0.0) for s in session_ids}})

    def controller(self) -> FleetController:
        return FleetController(config=self.config, guard=GUARD, settle_s=self.config.reservation_settle_s,
                               tenure=Tenure(), view=self.view, owners=self.owners, reservations=self.reservations,
                               relocation=self.relocation, engines=self.engines, drainer=self.drains,
                               provisioner=None, log=LOG)

    def drainer(self) -> Drainer:
        return Drainer(view=self.view, owners=self.owners, reservations=self.reservations, relocation=self.relocation,
                       guard=GUARD, config=self.config, settle_s=self.config.reservation_settle_s, log=LOG)
