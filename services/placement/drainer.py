"""Draining a host (`sf.placement.drain`): stop placing there, then move every session off it.

The host's record goes to `draining` (by CAS: from then on no placement, failover or drain
reserves room on it). Each session it owns gets a destination with room, reserved there by
CAS, and is live-moved through the mover in rounds that share no receiver. A session whose
live move the mover refuses (inadmissible) or rolls back is handed over instead: fence
assigns the destination at the next version (CAS on the version the drain saw), and the
destination restores fence's latest checkpoint and replays the input after it. When fence
shows the host owning nothing and its heartbeat shows no resident session, it is `drained`.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

import msgspec

from libs import bus, names
from libs.errors import Conflict, Rejected, StatefleetError
from libs.fence.ownership import assign, read_owner
from libs.schemas.motion import MoveReceipt, MoveRequest
from libs.schemas.placement import DrainReport, HostRecord, HostRequest, SessionOutcome
from services.placement import drain, failover

if TYPE_CHECKING:
    from services.placement.service import PlacementService

MAX_PASSES = 3  # sessions that reached the host while it drained get another pass
RESIDENT_WAIT_S = 15.0  # a handed-over copy is dropped by its old host after its orphan grace


class Drainer:
    def __init__(self, svc: PlacementService) -> None:
        self.svc = svc

    async def drain(self, req: HostRequest) -> DrainReport:
        svc, host = self.svc, req.host_id
        svc._known(host)
        await svc.records.change(host, lambda r: msgspec.structs.replace(r, state="draining"))
        svc.log.info("host_draining", host_id=host)
        outcomes: list[SessionOutcome] = []
        for _ in range(MAX_PASSES):
            owned = await self._owned(host)
            if not owned:
                break
            moves, no_room = drain.plan_moves(host, owned, svc._up_hosts(), svc.hosts.values, svc.guard,
                                              svc.config.reservation_settle_s, time.time())
            outcomes += [SessionOutcome(session_id=sid, outcome="no_room",
                                        detail=",".join(f"{e.host_id}:{e.reason}" for e in ests))
                         for sid, ests in no_room]
            ready = []
            for m in moves:
                try:
                    await svc.reserve(m.session_id, m.dest, m.estimate.busy_fraction, m.estimate.state_bytes,
                                      m.incarnation)
                    ready.append(m)
                except Rejected as e:
                    outcomes.append(SessionOutcome(session_id=m.session_id, outcome="no_room", dest=m.dest,
                                                   detail=e.detail))
            for rnd in drain.rounds(ready):
                outcomes += await asyncio.gather(*(self._move(host, m) for m in rnd))
            if not ready:
                break  # nothing had room: another pass would decide the same
        remaining = len(await self._owned(host))
        record = await svc.records.change(host, _drained if remaining == 0 else lambda r: r)
        if remaining == 0:
            await self._wait_resident_gone(host)
        state = record.state if host in svc.liveness.live else "dead"
        report = DrainReport(host_id=host, state=state, outcomes=_last_per_session(outcomes), remaining=remaining)
        svc.log.info("host_drain_done", host_id=host, state=report.state, remaining=remaining,
                     outcomes=[(o.session_id, o.outcome) for o in report.outcomes])
        return report

    async def _owned(self, host: str) -> list[failover.Stranded]:
        """The sessions fence's log shows `host` owning (the `sf_sessions` hint says which to read)."""
        out = []
        for s in self.svc.owned(host):
            tail = await read_owner(self.svc.js, s.session_id)
            view = tail.view
            if view.closed or view.owner is None or view.owner.server_id != host:
                continue
            contract, backend = await self.svc.spec(s.session_id)
            out.append(failover.Stranded(s.session_id, view, contract, backend))
        return out

    async def _move(self, host: str, m: drain.Move) -> SessionOutcome:
        svc = self.svc
        deadline = svc.config.drain_move_deadline_s
        why = ""
        if host in svc.liveness.live:
            try:
                receipt = await bus.request(svc.nc, names.MOVER_MOVE, MoveRequest(
                    session_id=m.session_id, source=host, dest=m.dest, deadline_s=deadline),
                    MoveReceipt, timeout_s=deadline + 10)
                why = f"live move {receipt.outcome}: {receipt.reason}"
                if receipt.outcome == "committed" and await self._owner_is(m.session_id, m.dest):
                    await svc.release(host, [m.session_id])
                    return SessionOutcome(session_id=m.session_id, outcome="moved", dest=m.dest)
            except StatefleetError as e:
                why = f"live move failed: {e.code}: {e.detail}"
        else:
            why = "host is not live: no live move"
        try:  # checkpoint + replay: the destination restores fence's latest checkpoint, then replays
            await assign(svc.nc, svc.js, m.session_id, m.dest, expect_version=m.version, incarnation=m.incarnation)
        except Conflict as e:
            if await self._owner_is(m.session_id, m.dest):
                await svc.release(host, [m.session_id])
                return SessionOutcome(session_id=m.session_id, outcome="moved", dest=m.dest, detail=why)
            await svc.release(m.dest, [m.session_id])
            return SessionOutcome(session_id=m.session_id, outcome="failed", dest=m.dest,
                                  detail=f"{why}; hand-over refused: {e.detail}")
        await svc.release(host, [m.session_id])
        return SessionOutcome(session_id=m.session_id, outcome="handed_over", dest=m.dest, detail=why)

    async def _owner_is(self, sid: str, host: str) -> bool:
        owner = (await read_owner(self.svc.js, sid)).view.owner
        return owner is not None and owner.server_id == host

    async def _wait_resident_gone(self, host: str) -> None:
        """Until the host's heartbeat shows no session (copies handed over are dropped after a grace)."""
        deadline = time.monotonic() + RESIDENT_WAIT_S
        while time.monotonic() < deadline:
            entry = self.svc.liveness.entry(host)
            if entry is None or entry.sessions == 0:
                return
            await asyncio.sleep(0.2)


def _drained(record: HostRecord) -> HostRecord:
    # An undrain that landed meanwhile wins: only a host still draining becomes drained.
    return msgspec.structs.replace(record, state="drained") if record.state == "draining" else record


def _last_per_session(outcomes: list[SessionOutcome]) -> list[SessionOutcome]:
    last = {o.session_id: o for o in outcomes}
    return sorted(last.values(), key=lambda o: o.session_id)
