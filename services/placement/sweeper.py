"""Failover sweeps: reassign every session whose owner process is dead, orphan the ones nothing has room for.

Level-triggered: each sweep reads which sessions the `sf_sessions` hint shows on a dead owner,
confirms each on fence's log, and carries out `failover.plan`'s decisions: a reservation by CAS
on the chosen host, then fence's `assign` at the version the dead owner held. Of two placers that
decided the same, exactly one assign lands; the other lets its reservation go. After the
failovers, reservations of sessions that closed, or that fence shows owned elsewhere for longer
than `grace_s`, are unreserved.
"""

from __future__ import annotations

import asyncio
import time

import structlog

from libs.contracts import Guard
from libs.errors import Conflict, Rejected, StatefleetError
from libs.schemas.common import SessionSummary
from libs.schemas.fence import Owner, SessionView
from libs.telemetry import counter
from services.placement import failover
from services.placement.control_config import FleetControlConfig
from services.placement.parts import Owners, Reserving
from services.placement.policy import PathRates
from services.placement.view import FleetView

_failovers = counter("sf_placement_failovers_total", "Failover decisions by outcome")


class Sweeper:
    def __init__(self, *, view: FleetView, owners: Owners, reservations: Reserving, guard: Guard,
                 config: FleetControlConfig,
                 settle_s: float, grace_s: float, log: structlog.typing.FilteringBoundLogger) -> None:
        self.view, self.owners, self.reservations = view, owners, reservations
        self.config = config  # the policy's knobs (`choice.py`), read at each decision
        self.guard, self.settle_s, self.grace_s, self.log = guard, settle_s, grace_s, log
        self._orphans: set[str] = set()

    async def sweep(self) -> None:
        """Reassign every session whose owner process is dead; orphan the ones nothing has room for."""
        now = time.monotonic()
        liveness = self.view.liveness
        summaries = self.view.summaries()
        states = {s.session_id: failover.owner_state(_hinted_view(s), liveness, now)
                  for s in list(summaries.values()) if s.state != "closed" and s.owner_server_id}
        for sid in [sid for sid, st in states.items() if st == "alive" and summaries[sid].state == "orphaned"]:
            # Its owner turned out alive (it was heard again): the summary says what the log says.
            await self._mark(sid, summaries[sid].owner_version, "")
        suspects = [summaries[sid] for sid, st in states.items() if st == "dead"]
        stranded = []
        for s in suspects:
            try:
                view = await self.owners.view(s.session_id)
                if failover.owner_state(view, liveness, now) != "dead":
                    continue
                contract, backend = await self.owners.spec(s.session_id)
            except StatefleetError as e:
                self.log.info("stranded_unread", session_id=s.session_id, code=e.code)
                continue
            threads = await self.owners.threads(s.session_id)  # a replay is bit-exact at its own count
            stranded.append(failover.Stranded(s.session_id, view, contract, backend, threads))
        if not stranded:
            return
        decisions = failover.plan(stranded, self.view.up_hosts(), self.view.records(), self.config.params(self.guard),
                                  self.settle_s, time.time(), paths=PathRates(default_bps=self.config.path_bps))
        views = {s.session_id: s.view for s in stranded}
        await asyncio.gather(*(self._carry_out(d, views[d.session_id]) for d in decisions))

    async def _carry_out(self, d: failover.Reassign | failover.Orphan, view: SessionView) -> None:
        sid = d.session_id
        if isinstance(d, failover.Orphan):
            _failovers.add(1, {"outcome": "orphaned"})
            reason = orphan_reason(d)
            if sid not in self._orphans:
                self._orphans.add(sid)
                self.log.warning("session_orphaned", session_id=sid, reason=reason)
            summary = self.view.summaries().get(sid)
            if summary is None or (summary.state, summary.reason) != ("orphaned", reason):
                await self._mark(sid, view.owner.version if view.owner else 0, reason)
            return
        try:
            if not d.reserved:
                await self.reservations.reserve(sid, d.host_id, d.incarnation)
            await self.owners.assign(sid, d.host_id, expect_version=d.expect_version, incarnation=d.incarnation)
        except Rejected:  # the host filled up (or started draining) since we looked: the next sweep re-plans
            _failovers.add(1, {"outcome": "no_room_on_cas"})
            return
        except Conflict:
            # Another placer (or a move) got there first: keep the reservation only if it chose our host.
            if not await self.owners.owner_is(sid, d.host_id):
                await self.reservations.unreserve(d.host_id, [sid])
            _failovers.add(1, {"outcome": "lost_race"})
            return
        self._orphans.discard(sid)
        _failovers.add(1, {"outcome": "reassigned"})
        self.log.info("failed_over", session_id=sid, host_id=d.host_id, version=d.expect_version + 1,
                      dead_owner=view.owner.server_id if view.owner else "")

    async def _mark(self, session_id: str, version: int, orphaned: str) -> None:
        """Fence's orphan mark on the sessions hint: only a display hint, so a failure is logged, not raised."""
        try:
            await self.owners.mark(session_id, version, orphaned)
        except StatefleetError as e:
            self.log.info("orphan_mark_failed", session_id=session_id, code=e.code)

    async def reconcile(self) -> None:
        """Unreserve the reservations of sessions that closed, or that fence shows owned elsewhere for a while."""
        now = time.time()
        summaries = self.view.summaries()
        for host_id, record in list(self.view.records().items()):
            stale = []
            for sid, r in record.sessions.items():
                s = summaries.get(sid)
                if s is not None and s.state == "closed":
                    stale.append(sid)
                elif now - r.at > self.grace_s and (s is None or s.owner_server_id != host_id):
                    stale.append(sid)
            if stale:
                await self.reservations.unreserve(host_id, stale)


def orphan_reason(d: failover.Orphan) -> str:
    """What `statefleet status` shows for a session waiting for room: every live host's reason, so an
    operator sees why (full, busy, draining) and that it is queued, not stuck; its client hears it too
    (fence's `orphaned` notice). Every sweep retries it."""
    hosts = ", ".join(f"{e.host_id} {e.reason}" for e in d.estimates) or "no live host"
    return f"waiting for room ({hosts})"


def _hinted_view(s: SessionSummary) -> SessionView:
    """The ownership the `sf_sessions` hint shows, as fence's view (enough to suspect a dead owner)."""
    return SessionView(owner=Owner(server_id=s.owner_server_id, version=s.owner_version),
                       incarnation=s.owner_incarnation, closed=s.state == "closed")
