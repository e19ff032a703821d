"""The fleet controller's action runners: one move, suspend or resume, carried out on the fresh state.

`controller.py` decides, and starts each of these as a task that holds the session busy; the runners
reserve room, call the mover and the engine hosts' verbs, and say what came of it in fence's log (a
shed session's mark, its client's notice) and in the controller's `Activity`.
"""

from __future__ import annotations

import time

import structlog

from libs.errors import Rejected
from libs.schemas.common import ShedKind
from libs.telemetry import counter
from services.placement import fleetview
from services.placement.control_config import FleetControlConfig
from services.placement.parts import EngineCalls, FleetReader, Owners, Relocating, Reserving
from services.placement.policy import Move, Resume, Suspend

applied = counter("sf_placement_fleet_actions_total", "Fleet-controller actions applied, by kind and outcome")


class FleetActions:
    """`config` is the controller's, read afresh at each action."""

    def __init__(self, *, config: FleetControlConfig, view: FleetReader, owners: Owners, reservations: Reserving,
                 relocation: Relocating, engines: EngineCalls, activity: fleetview.Activity,
                 log: structlog.typing.FilteringBoundLogger) -> None:
        self.config, self.view, self.owners, self.reservations = config, view, owners, reservations
        self.relocation, self.engines, self.activity, self.log = relocation, engines, activity, log

    async def move(self, a: Move) -> bool:
        """Reserve on the receiver, live-move through the mover, settle the reservations by what fence shows."""
        entry = self.view.entry(a.dst)
        if entry is None:
            return False
        try:
            await self.reservations.reserve(a.session_id, a.dst, entry.incarnation)
        except Rejected as e:  # filled up since the snapshot: the next round decides again
            applied.add(1, {"kind": "move", "outcome": "no_room"})
            self.log.info("fleet_move_no_room", session_id=a.session_id, dst=a.dst, detail=e.detail)
            return False
        why = await self.relocation.move(a.session_id, a.src, a.dst)
        moved = await self.relocation.settle(a.session_id, a.src, a.dst)
        # A refused move still counts against the session's window: a session no move can take is not retried
        # every round.
        self.activity.moved(a.session_id, time.monotonic(), self.config.knobs().move_window_s)
        if moved:
            applied.add(1, {"kind": "move", "outcome": "committed"})
            self.log.info("fleet_moved", session_id=a.session_id, src=a.src, dst=a.dst, gain_ms=round(a.gain_ms, 2),
                          t_migrate_s=round(a.t_migrate_s, 4))
            return True
        applied.add(1, {"kind": "move", "outcome": "not_committed"})
        self.log.info("fleet_move_not_committed", session_id=a.session_id, src=a.src, dst=a.dst, why=why)
        return False

    async def suspend(self, a: Suspend) -> None:
        await self.engines.suspend(a.host_id, a.session_id)
        self.activity.suspended(a.session_id, time.monotonic())
        applied.add(1, {"kind": "suspend", "outcome": "ok"})
        self.log.info("fleet_suspended", session_id=a.session_id, host_id=a.host_id, reason=a.reason)
        if a.reason:  # shed from a device past its limit: said out loud, in the summary `statefleet status` shows
            owner = (await self.owners.view(a.session_id)).owner  # and to its client, by fence (a notice)
            waits = "re-queued until a device has room" if a.reason == "capacity_lost" else "resumes on input where there is room"
            await self.owners.mark(a.session_id, owner.version if owner else 0, shed_kind=a.reason,
                                   shed=f"{a.reason}: {a.host_id}'s device measured past its limit; {waits}")

    async def resume(self, a: Resume, src: str) -> None:
        """Back on its own host; on another one (its own is full) by resuming in place and moving at once."""
        try:
            if a.host_id == src:
                entry = self.view.entry(src)
                if entry is None:
                    return
                await self.reservations.reserve(a.session_id, src, entry.incarnation)
            await self.engines.resume(src, a.session_id)
        except Rejected as e:  # no room after all: it waits, and says so
            await self.tell_waiting(a.session_id, e.detail)
            raise
        applied.add(1, {"kind": "resume", "outcome": "ok"})
        self.log.info("fleet_resumed", session_id=a.session_id, host_id=src, to=a.host_id)
        summary = self.view.summaries().get(a.session_id)
        if summary is not None and summary.shed:  # its mark goes, and its client hears it is back
            owner = (await self.owners.view(a.session_id)).owner
            await self.owners.mark(a.session_id, owner.version if owner else 0, resumed=True)
        if a.host_id != src:
            await self.move(Move(session_id=a.session_id, src=src, dst=a.host_id, busy_fraction=a.busy_fraction,
                                 state_bytes=a.state_bytes, gain_ms=0.0, t_migrate_s=0.0, stall_ms=0.0))

    async def tell_waiting(self, sid: str, why: str) -> None:
        """A suspended session that wants to resume (input came, or it was re-queued) and finds no room is
        marked shed, so `statefleet status` and its client hear it waits, unless a mark already says so.

        Most such sessions were shed by this controller and carry their mark already. This one did not: a
        suspend whose reply came after the request timed out (a loaded host) is done on the host while
        `suspend` gave up on it and marked nothing, and an idle-offloaded session's input can arrive when
        no device has room. Without the mark it sat suspended, its input unapplied, told to nobody (the
        `bench.failover --hog 2` run of 2026-12-03 18:21)."""
        summary = self.view.summaries().get(sid)
        if summary is None or summary.shed or summary.state == "closed":
            return
        contract, _ = await self.owners.spec(sid)
        kind: ShedKind = "capacity_lost" if contract.session_class == "C1" else "overload"
        owner = (await self.owners.view(sid)).owner
        await self.owners.mark(sid, owner.version if owner else 0, shed_kind=kind,
                               shed=f"{kind}: suspended, waiting for a device with room ({why})")
        self.log.warning("fleet_session_waits", session_id=sid, shed_kind=kind, why=why)
