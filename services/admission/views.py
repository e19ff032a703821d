"""What admission shows about a session and the fleet: built from its records, fence's log (a hint)
and the live hosts. Nothing here decides anything."""

from __future__ import annotations

import time

import msgspec

from libs import bus, names
from libs.contracts import Reservations
from libs.errors import StatefleetError
from libs.fence.ownership import read_owner
from libs.schemas.admission import AdmissionMetrics, FleetHost, FleetView, SessionRecord, SessionStatus
from libs.schemas.base import decode
from libs.schemas.common import EngineEntry, SessionSummary


def status(r: SessionRecord, queue_position: int = 0) -> SessionStatus:
    """The record as the API shows it (`queue_position` for a queued one)."""
    est = r.verdict.estimates[0] if r.verdict.estimates else None
    end = r.placed_at or (r.updated_at if r.state == "timed_out" else time.time())
    metrics = AdmissionMetrics(queue_wait_s=max(0.0, end - r.created_at),
                               tier=est.tier if est else 0,
                               busy_fraction=r.demand.busy_fraction if r.demand else 0.0,
                               state_bytes=r.demand.state_bytes if r.demand else 0)
    verdict = r.verdict
    if r.state == "queued":
        verdict = msgspec.structs.replace(verdict, queue_position=queue_position)
    return SessionStatus(session_id=r.session_id, state=r.state, backend=r.backend, contract=r.contract,
                         host_id=r.host_id, verdict=verdict, metrics=metrics, created_at=r.created_at,
                         updated_at=r.updated_at)


async def owned_status(js: bus.JetStream, r: SessionRecord, queue_position: int, live: list[EngineEntry],
                       log) -> SessionStatus:
    """The status with fence's owner as the log last said (a hint; no read decides anything)."""
    view = status(r, queue_position)
    if r.state != "placed":
        return view
    try:
        tail = await read_owner(js, r.session_id)
    except StatefleetError as e:
        log.info("owner_unread", session_id=r.session_id, code=e.code)
        return view
    owner, claim = tail.view.owner, tail.view.claim
    if owner is not None:
        view = msgspec.structs.replace(view, owner_server_id=owner.server_id, owner_version=owner.version,
                                       claimed=claim == owner, owner_state=await owner_state(js, r.session_id, live))
    return view


async def owner_state(js: bus.JetStream, session_id: str, live: list[EngineEntry]) -> str:
    """The `sf_sessions` word on the owner; never `serving` while its host process is not live."""
    try:
        kv = await bus.bucket(js, names.SESSIONS_BUCKET)
        entry = await bus.kv_read(kv, session_id) if kv is not None else None
        if entry is None:
            return ""
        summary = decode(entry.value or b"", SessionSummary)
    except StatefleetError:
        return ""
    if summary.state == "serving":
        host = next((h for h in live if h.host_id == summary.owner_server_id), None)
        if host is None or summary.owner_incarnation not in ("", host.incarnation):
            return "owner_dead"
    return summary.state


def fleet(live: list[EngineEntry], reservations: Reservations) -> FleetView:
    """Each live host with what admission has promised it that its heartbeat does not show yet."""
    hosts = []
    for h in sorted(live, key=lambda h: h.host_id):
        pending = reservations.on(h)
        hosts.append(FleetHost(host_id=h.host_id, device=h.device, heartbeat_at=h.heartbeat_at,
                               sessions=h.sessions, busy_fraction=h.busy_fraction,
                               free_memory_bytes=h.free_memory_bytes, memory_bytes=h.memory_bytes,
                               pending_sessions=len(pending),
                               pending_busy_fraction=sum(p.busy_fraction for p in pending),
                               pending_state_bytes=sum(p.state_bytes for p in pending)))
    return FleetView(hosts=hosts)
