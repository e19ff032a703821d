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

import structlog

from libs.contracts import Guard
from libs.errors import Conflict, Rejected
from libs.schemas.placement import DrainReport, HostRequest, SessionOutcome
from services.placement import drain, failover
from services.placement.control_config import FleetControlConfig
from services.placement.drain import Departure
from services.placement.parts import FleetReader, Owners, Relocating, Reserving
from services.placement.policy import PathRates

MAX_PASSES = 3  # sessions that reached the host while it drained get another pass
RESIDENT_WAIT_S = 15.0  # a handed-over copy is dropped by its old host after its orphan grace


class Drainer:
    def __init__(self, *, view: FleetReader, owners: Owners, reservations: Reserving, relocation: Relocating,
                 guard: Guard, config: FleetControlConfig,
                 settle_s: float, log: structlog.typing.FilteringBoundLogger) -> None:
        self.view, self.owners, self.reservations, self.relocation = view, owners, reservations, relocation
        self.config = config  # the policy's knobs (`choice.py`), read at each decision
        self.guard, self.settle_s, self.log = guard, settle_s, log

    async def drain(self, req: HostRequest) -> DrainReport:
        host = req.host_id
        self.view.check_known(host)
        await self.reservations.set_state(host, "draining")
        self.log.info("host_draining", host_id=host)
        outcomes: list[SessionOutcome] = []
        for _ in range(MAX_PASSES):
            owned = await self._owned(host)
            if not owned:
                break
            moves, no_room = drain.plan_moves(host, owned, self.view.up_hosts(), self.view.records(),
                                              self.config.params(self.guard), self.settle_s, time.time(),
                                              paths=PathRates(default_bps=self.config.path_bps))
            outcomes += [SessionOutcome(session_id=sid, outcome="no_room",
                                        detail=",".join(f"{e.host_id}:{e.reason}" for e in ests))
                         for sid, ests in no_room]
            ready = []
            for m in moves:
                try:
                    await self.reservations.reserve(m.session_id, m.dest, m.incarnation)
                    ready.append(m)
                except Rejected as e:
                    outcomes.append(SessionOutcome(session_id=m.session_id, outcome="no_room", dest=m.dest,
                                                   detail=e.detail))
            for rnd in drain.rounds(ready):
                outcomes += await asyncio.gather(*(self._move(host, m) for m in rnd))
            if not ready:
                break  # nothing had room: another pass would decide the same
        remaining = len(await self._owned(host))
        if remaining == 0:
            record = await self.reservations.set_state(host, "drained", only_from="draining")
            await self._wait_resident_gone(host)
        else:
            record, _ = await self.reservations.read(host)
        state = record.state if self.view.is_live(host) else "dead"
        report = DrainReport(host_id=host, state=state, outcomes=_last_per_session(outcomes), remaining=remaining)
        self.log.info("host_drain_done", host_id=host, state=report.state, remaining=remaining,
                      outcomes=[(o.session_id, o.outcome) for o in report.outcomes])
        return report

    async def _owned(self, host: str) -> list[failover.Stranded]:
        """The sessions fence's log shows `host` owning (the `sf_sessions` hint says which to read)."""
        out = []
        for s in self.view.owned(host):
            view = await self.owners.view(s.session_id)
            if view.closed or view.owner is None or view.owner.server_id != host:
                continue
            contract, backend = await self.owners.spec(s.session_id)
            threads = await self.owners.threads(s.session_id)  # its blocks run at this count wherever they run
            out.append(failover.Stranded(s.session_id, view, contract, backend, threads))
        return out

    async def _move(self, host: str, m: Departure) -> SessionOutcome:
        if self.view.is_live(host):
            why = "live move " + await self.relocation.move(m.session_id, host, m.dest)
            if await self.relocation.landed(m.session_id, host, m.dest):
                return SessionOutcome(session_id=m.session_id, outcome="moved", dest=m.dest)
        else:
            why = "host is not live: no live move"
        try:  # checkpoint + replay: the destination restores fence's latest checkpoint, then replays
            await self.owners.assign(m.session_id, m.dest, expect_version=m.version, incarnation=m.incarnation)
        except Conflict as e:
            if await self.relocation.settle(m.session_id, host, m.dest):
                return SessionOutcome(session_id=m.session_id, outcome="moved", dest=m.dest, detail=why)
            return SessionOutcome(session_id=m.session_id, outcome="failed", dest=m.dest,
                                  detail=f"{why}; hand-over refused: {e.detail}")
        await self.reservations.unreserve(host, [m.session_id])
        return SessionOutcome(session_id=m.session_id, outcome="handed_over", dest=m.dest, detail=why)

    async def _wait_resident_gone(self, host: str) -> None:
        """Until the host's heartbeat shows no session (copies handed over are dropped after a grace)."""
        deadline = time.monotonic() + RESIDENT_WAIT_S
        while time.monotonic() < deadline:
            entry = self.view.entry(host)
            if entry is None or entry.sessions == 0:
                return
            await asyncio.sleep(0.2)


def _last_per_session(outcomes: list[SessionOutcome]) -> list[SessionOutcome]:
    last = {o.session_id: o for o in outcomes}
    return sorted(last.values(), key=lambda o: o.session_id)
