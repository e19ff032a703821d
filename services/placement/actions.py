"""The fleet controller's action runners: one move, suspend or resume, carried out on the fresh state.

`controller.py` decides, and starts each of these as a task that holds the session busy; the runners
reserve room, call the mover and the engine hosts' verbs, and say what came of it in fence's log (a
shed session's mark, its client's notice) and in the controller's `Activity`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import structlog

from libs.errors import Conflict, Rejected, StatefleetError, Timeout
from libs.schemas.common import ShedKind
from libs.schemas.engine import SessionInfo
from libs.telemetry import counter
from services.placement import fleetview
from services.placement.control_config import FleetControlConfig
from services.placement.parts import EngineCalls, FleetReader, Owners, Relocating, Reserving
from services.placement.policy import Move, Resume, Suspend

applied = counter("sf_placement_fleet_actions_total", "Fleet-controller actions applied, by kind and outcome")


@dataclass(frozen=True, slots=True)
class Unanswered:
    """A suspend or resume whose reply did not come, and which the host may still carry out."""

    host_id: str
    want: Literal["suspended", "running"]
    reason: ShedKind = ""  # a suspend's shed reason


class FleetActions:
    """`config` is the controller's, read afresh at each action. `unanswered`: session → a suspend or resume
    of it the host may still be carrying out (see `suspend`)."""

    def __init__(self, *, config: FleetControlConfig, view: FleetReader, owners: Owners, reservations: Reserving,
                 relocation: Relocating, engines: EngineCalls, activity: fleetview.Activity,
                 log: structlog.typing.FilteringBoundLogger) -> None:
        self.config, self.view, self.owners, self.reservations = config, view, owners, reservations
        self.relocation, self.engines, self.activity, self.log = relocation, engines, activity, log
        self.unanswered: dict[str, Unanswered] = {}

    async def move(self, a: Move) -> bool:
        """Reserve on the receiver, live-move through the mover, settle the reservations by what fence shows."""
        self.unanswered.pop(a.session_id, None)
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
        """Suspend on its host; one shed for a reason is marked shed (its summary, its client's notice).

        The invariant: after any suspend attempt, a session that is suspended on its host for a shed reason
        carries that shed mark. A loaded host can answer after the request timed out (its suspend waits for
        a block boundary, and goes on once the caller gave up), so a suspend that timed out, or that found the
        session no longer running (an earlier unanswered one did it), asks the host how the session stands:
        suspended, it is finished as if the reply had come; still running (or the host not answering), it
        is `unanswered` and each round's status read looks again (`confirm`). A new action for the session
        supersedes that."""
        self.unanswered.pop(a.session_id, None)
        try:
            # a C1 shed as capacity_lost is re-queued for the room it leaves: its host keeps that share priced
            await self.engines.suspend(a.host_id, a.session_id, hold_share=a.reason == "capacity_lost")
        except (Timeout, Conflict) as e:
            if not await self._reconciled(a.session_id, Unanswered(a.host_id, "suspended", a.reason), e):
                raise
        await self._suspended(a.session_id, a.host_id, a.reason)

    async def resume(self, a: Resume, src: str) -> None:
        """Back on its own host; on another one (its own is full) by resuming in place and moving at once.
        A resume whose reply did not come is reconciled as a suspend is: once the host shows it running its
        shed mark goes, so a running session is not left marked as waiting."""
        self.unanswered.pop(a.session_id, None)
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
        except (Timeout, Conflict) as e:
            if not await self._reconciled(a.session_id, Unanswered(src, "running"), e):
                raise
        await self._resumed(a.session_id, src, a.host_id)
        if a.host_id != src:
            await self.move(Move(session_id=a.session_id, src=src, dst=a.host_id, busy_fraction=a.busy_fraction,
                                 state_bytes=a.state_bytes, gain_ms=0.0, t_migrate_s=0.0, stall_ms=0.0))

    async def confirm(self, statuses: Mapping[str, list[SessionInfo]]) -> None:
        """Each round, from its status read: an unanswered suspend or resume the host has done since is
        finished; one whose session is gone from its host (closed, moved) is dropped; one whose host still
        shows the state before it, or did not answer, waits for the next round."""
        for sid, u in list(self.unanswered.items()):
            infos = statuses.get(u.host_id)
            if infos is None:
                continue
            state = _state_of(sid, infos)
            if self.view.host_of(sid) != u.host_id or state not in ("running", "suspended"):
                del self.unanswered[sid]
            elif state == u.want:
                del self.unanswered[sid]
                self.log.info("fleet_action_confirmed", session_id=sid, host_id=u.host_id, state=state)
                try:
                    await self._finish(sid, u)
                except StatefleetError as e:  # fence not reachable: the next round tries again
                    self.unanswered.setdefault(sid, u)
                    self.log.warning("fleet_action_confirm_failed", session_id=sid, code=e.code, detail=e.detail)

    async def _reconciled(self, sid: str, u: Unanswered, e: StatefleetError) -> bool:
        """Whether the host shows the session as `u.want` after all; if not, and it may still get there (the
        host still shows it before, or did not answer), the rounds look again."""
        infos = (await self.engines.statuses([u.host_id])).get(u.host_id)
        state = None if infos is None else _state_of(sid, infos)
        if state == u.want:
            self.log.info("fleet_action_reconciled", session_id=sid, host_id=u.host_id, state=state, code=e.code)
            return True
        if state is None or state in ("running", "suspended"):
            self.unanswered[sid] = u
        self.log.warning("fleet_action_unanswered", session_id=sid, host_id=u.host_id, want=u.want,
                         state=state if state is not None else "host did not answer", code=e.code)
        return False

    async def _finish(self, sid: str, u: Unanswered) -> None:
        if u.want == "suspended":
            await self._suspended(sid, u.host_id, u.reason)
        else:  # a resume onto another host moves at the rebalancer's next decision, not here
            await self._resumed(sid, u.host_id, u.host_id)

    async def _suspended(self, sid: str, host_id: str, reason: ShedKind) -> None:
        self.activity.suspended(sid, time.monotonic())
        applied.add(1, {"kind": "suspend", "outcome": "ok"})
        self.log.info("fleet_suspended", session_id=sid, host_id=host_id, reason=reason)
        if reason:  # shed from a device past its limit: said out loud, in the summary `statefleet status` shows
            owner = (await self.owners.view(sid)).owner  # and to its client, by fence (a notice)
            waits = "re-queued until a device has room" if reason == "capacity_lost" else "resumes on input where there is room"
            await self.owners.mark(sid, owner.version if owner else 0, shed_kind=reason,
                                   shed=f"{reason}: {host_id}'s device measured past its limit; {waits}")

    async def _resumed(self, sid: str, src: str, to: str) -> None:
        applied.add(1, {"kind": "resume", "outcome": "ok"})
        self.log.info("fleet_resumed", session_id=sid, host_id=src, to=to)
        summary = self.view.summaries().get(sid)
        if summary is not None and summary.shed:  # its mark goes, and its client hears it is back
            owner = (await self.owners.view(sid)).owner
            await self.owners.mark(sid, owner.version if owner else 0, resumed=True)

    async def tell_waiting(self, sid: str, why: str) -> None:
        """A suspended session that wants to resume (input came, or it was re-queued) and finds no room is
        marked shed, so `statefleet status` and its client hear it waits, unless a mark already says so.

        Most such sessions were shed by this controller and carry their mark already (`suspend` reconciles
        one whose reply came too late). This one did not: an idle-offloaded session's input can arrive when
        no device has room, or a controller took the tenure after its predecessor's suspend went unanswered.
        Without the mark it sat suspended, its input unapplied, told to nobody (the `bench.failover --hog 2`
        run of 2026-12-03 18:21)."""
        summary = self.view.summaries().get(sid)
        if summary is None or summary.shed or summary.state == "closed":
            return
        contract, _ = await self.owners.spec(sid)
        kind: ShedKind = "capacity_lost" if contract.session_class == "C1" else "overload"
        owner = (await self.owners.view(sid)).owner
        await self.owners.mark(sid, owner.version if owner else 0, shed_kind=kind,
                               shed=f"{kind}: suspended, waiting for a device with room ({why})")
        self.log.warning("fleet_session_waits", session_id=sid, shed_kind=kind, why=why)


def _state_of(sid: str, infos: list[SessionInfo]) -> str:
    """The session's state in its host's status ("" where the host does not hold it)."""
    return next((i.state for i in infos if i.session_id == sid), "")
