"""The fleet controller: one placement instance at a time applies the pure policies' decisions.

Every `control_s` the instance holding the tenure (`tenure.py`, key "fleet" in
`sf_placement_lease`) reads each live host's sessions (`sf.engine.<host>.status`), builds the
policies' snapshot (`fleetview.py`) and runs `policy.decide`: min-max rebalancing gated by the
admissibility calculator (a round's moves share no receiver; cooldown and bounded moves per
session per window), autoscaling with hysteresis, idle suspend and resume. It then applies the
actions, each a task that holds its session busy (the runners are `actions.py`'s); it decides nothing
itself, except to refuse one that the fresh state no longer allows:

- Move: reserve the session's demand on the receiver by CAS, then ask the mover for a live move
  (the mover runs its own admission too); the source's reservation goes once fence shows the
  receiver owning it, the receiver's if the move did not commit.
- Suspend / Resume: the engine host's `suspend` / `resume` verbs. A resume on another host (its
  own is full) resumes in place and live-moves at once; the frontend sees a delay, never an error.
- ScaleOut: the provisioner starts hosts; they count as coming until their first heartbeat
  (taken after they measured their profile: they arrive pre-warmed), or `provision_timeout_s`.
- Drain: scale-in is a drain (`drainer.py`: live moves, hand-over only if a move is refused).
- StopHost: the provisioner stops the host only after `stoppable` found, on fresh reads, that it
  owns no session, holds no reservation and has no move, suspend or resume in flight.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from typing import Any

import structlog

from libs.contracts import Contract, Guard
from libs.errors import StatefleetError
from libs.path_ewma import PathEwma
from libs.schemas.common import EngineEntry
from libs.schemas.placement import HostRequest
from libs.tasks import spawn
from libs.telemetry import histogram
from services.placement import fleetview
from services.placement.actions import FleetActions, applied
from services.placement.control_config import FleetControlConfig
from services.placement.parts import (
    Draining,
    EngineCalls,
    FleetReader,
    Owners,
    Relocating,
    Reserving,
    Tenancy,
)
from services.placement.policy import (
    Decision,
    Drain,
    Fleet,
    Move,
    Params,
    Resume,
    ScaleOut,
    StopHost,
    Suspend,
    decide,
)
from services.placement.provisioning import Provisioner
from services.placement.provisioning.local import LocalProvisioner

TENURE_KEY = "fleet"
REDRAIN_AFTER_S = 10.0  # a drain that left sessions behind (no room) is tried again this long after

_round_time = histogram("sf_placement_fleet_round", "One fleet-controller round (snapshot, decide, apply)", unit="s")


def provisioner_for(cfg: FleetControlConfig) -> Provisioner | None:
    if cfg.provisioner == "local":
        slots = [h.strip() for h in cfg.provision_hosts.split(",") if h.strip()]
        return LocalProvisioner(cfg.provision_dir, slots)
    return None


class FleetController:
    """`config` is read afresh every round (an operator's change applies at the next one); `settle_s` is
    how long a reservation counts against its host before a heartbeat shows it (`reservation_settle_s`)."""

    def __init__(self, *, config: FleetControlConfig, guard: Guard, settle_s: float, tenure: Tenancy,
                 view: FleetReader, owners: Owners, reservations: Reserving, relocation: Relocating,
                 engines: EngineCalls, drainer: Draining, provisioner: Provisioner | None,
                 log: structlog.typing.FilteringBoundLogger) -> None:
        self.config, self.guard, self.settle_s, self.tenure = config, guard, settle_s, tenure
        self.view, self.owners, self.reservations = view, owners, reservations
        self.relocation, self.engines, self.drainer = relocation, engines, drainer
        self.provisioner = provisioner
        self.activity = fleetview.Activity()
        self.arrivals = fleetview.Arrivals()
        self.paths = PathEwma()  # measured rates of committed moves, from the mover's receipts
        self.busy: dict[str, tuple[str, str]] = {}  # session → (from, to): a move, suspend or resume in flight
        self.draining: set[str] = set()  # hosts a scale-in drain of ours is emptying
        self.drain_ended: dict[str, float] = {}
        self.asked: dict[str, float] = {}  # host → when we asked the provisioner for it
        self.last_scale_out_at = float("-inf")
        self.last_scale_in_at = float("-inf")
        self.rounds = 0  # rounds decided while holding the tenure
        self._tasks: set[asyncio.Task[None]] = set()
        self.log = log.bind(part="fleet")
        self.actions = FleetActions(config=config, view=view, owners=owners, reservations=reservations,
                                    relocation=relocation, engines=engines, activity=self.activity, log=self.log)

    async def run(self) -> None:
        cfg = self.config
        try:
            while True:
                await asyncio.sleep(cfg.control_s)
                if not cfg.fleet_control:
                    continue
                started = time.monotonic()
                try:
                    if await self.tenure.renew():
                        await self.round()
                except StatefleetError as e:  # NATS trouble: the next round tries again
                    self.log.warning("fleet_round_failed", code=e.code, detail=e.detail)
                _round_time.record(time.monotonic() - started)
        finally:
            for task in self._tasks:
                task.cancel()
            await self.tenure.give_up()

    # ------------------------------------------------------------ one round

    async def round(self) -> Decision:
        view, cfg = self.view, self.config
        entries = view.live_hosts()
        statuses = await self.engines.statuses([e.host_id for e in entries])
        await self.actions.confirm(statuses)
        summaries = view.summaries()
        owners = {sid: s.owner_server_id for sid, s in summaries.items()
                  if s.state != "closed" and s.owner_server_id and s.claimed}
        specs = await self._specs([i.session_id for infos in statuses.values() for i in infos
                                   if owners.get(i.session_id)])
        now = time.monotonic()
        fleet = fleetview.snapshot(fleetview.Inputs(
            now=now, wall_now=time.time(), entries=entries, records=view.records(), sessions=statuses,
            owners=owners, specs=specs, busy=dict(self.busy), path_bps=cfg.path_bps, path_pairs=self.paths.pairs(),
            settle_s=self.settle_s, provisioning=self._provisioning(entries, now),
            arrivals_per_s=self.arrivals.rate(summaries, now, cfg.arrival_window_s),
            admissions=view.queued(), shed={sid: s.shed for sid, s in summaries.items() if s.shed},
            last_scale_out_at=self.last_scale_out_at, last_scale_in_at=self.last_scale_in_at), self.activity)
        self.activity.forget_except({s.session_id for s in fleet.sessions} | set(self.busy))
        params = cfg.params(self.guard)
        decision = decide(fleet, params, rebalancing=cfg.rebalance, scaling=self.provisioner is not None,
                          offload=params.keep_warm_s > 0, relieving=cfg.relieve_overload)
        self.rounds += 1
        self._redrain(fleet)
        for r in decision.refusals:
            self.log.debug("fleet_refusal", kind=r.kind, session_id=r.session_id, host_id=r.host_id, reason=r.reason)
            if r.kind == "resume":
                await self.actions.tell_waiting(r.session_id, r.reason)
        self._log_scaling(decision, fleet, params)
        await self._apply(decision, now, _residents(fleet))
        return decision

    def _log_scaling(self, decision: Decision, fleet: Fleet, p: Params) -> None:
        """The autoscaler's view every round: at info when it acts (a failure to scale is then diagnosable
        from the log alone), at debug otherwise."""
        m = decision.scaling
        if m is None:
            return
        acted = [type(a).__name__ for a in decision.actions if isinstance(a, ScaleOut | Drain)]
        (self.log.info if acted else self.log.debug)(
            "fleet_autoscale", acted=acted, util=round(m.util, 3), load=round(m.load, 3), hosts=m.hosts,
            want=m.want, pool=m.pool, queued=m.queued, band=(p.scale_in_below, p.target_util, p.scale_out_above),
            host_busy={h.host_id: round(h.entry.busy_fraction, 3) for h in fleet.hosts})

    async def _specs(self, sids: list[str]) -> dict[str, tuple[Contract, str]]:
        out: dict[str, tuple[Contract, str]] = {}
        for sid in sids:
            try:
                out[sid] = await self.owners.spec(sid)
            except StatefleetError:
                continue  # unknown to fence (closing): not in this round's snapshot
        return out

    def _provisioning(self, entries: list[EngineEntry], now: float) -> int:
        """Hosts asked for and not heard from yet (within `provision_timeout_s`)."""
        if self.provisioner is None:
            return 0
        live = {e.host_id for e in entries}
        for h in self.provisioner.managed():
            self.asked.setdefault(h, now)  # asked by an earlier tenure holder: counted from now
        for h in [h for h in self.asked if h in live or h not in self.provisioner.managed()]:
            del self.asked[h]
        return sum(1 for at in self.asked.values() if now - at < self.config.provision_timeout_s)

    # ------------------------------------------------------------ applying

    async def _apply(self, decision: Decision, now: float, residents: dict[str, int]) -> None:
        # Rebalancing runs before autoscaling within one decision, so a host a move touches may be the one
        # scale-in then drains: such moves are dropped (the drainer moves that host's sessions), and so are
        # resumes onto it.
        leaving = {a.host_id for a in decision.actions if isinstance(a, Drain)} | self.draining
        for a in decision.actions:
            if isinstance(a, Move) and not {a.src, a.dst} & leaving and self._worth_it(a, residents):
                residents[a.src] -= 1
                residents[a.dst] = residents.get(a.dst, 0) + 1
                self._start(a.session_id, a.src, a.dst, self.actions.move(a), "move")
            elif isinstance(a, Suspend) and a.host_id not in self.draining:  # a suspended session cannot move live
                self._start(a.session_id, a.host_id, a.host_id, self.actions.suspend(a), "suspend")
            elif isinstance(a, Resume) and a.host_id not in leaving:
                src = self.view.host_of(a.session_id)
                if src:
                    self._start(a.session_id, src, a.host_id, self.actions.resume(a, src), "resume")
            elif isinstance(a, ScaleOut):
                await self._scale_out(a, now)
            elif isinstance(a, Drain):
                await self._drain(a.host_id, now)
            elif isinstance(a, StopHost):
                await self._stop_host(a)

    def _worth_it(self, a: Move, residents: dict[str, int]) -> bool:
        """A rebalancing move never takes a host's only session: it could only trade places with an empty host.

        With one capacity model a host's load and a session's share are one number, and between equal
        hosts the policy sees no gain in such a move. But the source prices the session at the costs it
        learned while serving (on a loaded machine, many times its start-up profile) and an idle receiver
        at its start-up profile, so emptying a host still looks like a gain (docs/fleet.md, "Known
        limits"). Consolidating onto fewer hosts is the autoscaler's, by a drain."""
        if a.gain_ms and residents.get(a.src, 0) <= 1:
            self.log.debug("fleet_move_skipped", session_id=a.session_id, src=a.src, dst=a.dst, why="last_session")
            return False
        return True

    def _redrain(self, fleet: Fleet) -> None:
        """A host of ours that is draining or drained yet owns a session (one that reached it while its drain
        ran) is drained again, or it could never be given back."""
        if self.provisioner is None:
            return
        states = {h.host_id: h.state for h in fleet.hosts}
        for host in sorted({s.host_id for s in fleet.sessions} & self.provisioner.managed()):
            if states.get(host) in ("draining", "drained") and host not in self.draining \
                    and time.monotonic() - self.drain_ended.get(host, float("-inf")) > REDRAIN_AFTER_S:
                self._start_drain(host)

    def _start(self, sid: str, src: str, dst: str, coro: Coroutine[Any, Any, Any], kind: str) -> None:
        if sid in self.busy:
            coro.close()
            return
        self.busy[sid] = (src, dst)

        async def run() -> None:
            try:
                await coro
            except StatefleetError as e:
                applied.add(1, {"kind": kind, "outcome": e.code})
                self.log.warning("fleet_action_failed", kind=kind, session_id=sid, code=e.code, detail=e.detail)
            finally:
                self.busy.pop(sid, None)

        self._spawn(run(), f"{kind}:{sid}")

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        task = spawn(coro, name=f"placement:fleet:{name}", event="fleet_task_crashed")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _scale_out(self, a: ScaleOut, now: float) -> None:
        if self.provisioner is None:  # decide never scales without one
            return
        started = self.provisioner.start(a.count)
        # Scale-in waits its cooldown after a scale-out too: a host just asked for is not given back before
        # it could take load (measured load is noisy, and the band alone would let the fleet flap).
        self.last_scale_out_at = self.last_scale_in_at = now
        for h in started:
            self.asked[h] = now
            # A host id given out again must take sessions: whatever a former drain left on its record goes.
            await self.reservations.given_out(h)
        applied.add(1, {"kind": "scale_out", "outcome": "ok" if started else "exhausted"})
        self.log.info("fleet_scale_out", asked=a.count, started=started)

    async def _drain(self, host: str, now: float) -> None:
        if self.provisioner is None or host not in self.provisioner.managed() or host in self.draining:
            return  # a host we did not start is never given back, so never drained to be
        self.last_scale_in_at = now
        applied.add(1, {"kind": "drain", "outcome": "ok"})
        self.log.info("fleet_scale_in", host_id=host)
        self._start_drain(host)

    def _start_drain(self, host: str) -> None:
        self.draining.add(host)

        async def run() -> None:
            try:
                report = await self.drainer.drain(HostRequest(host_id=host))
                self.log.info("fleet_scale_in_drained", host_id=host, remaining=report.remaining,
                              outcomes=[(o.session_id, o.outcome) for o in report.outcomes])
            finally:
                self.draining.discard(host)
                self.drain_ended[host] = time.monotonic()

        self._spawn(run(), f"drain:{host}")

    async def _stop_host(self, a: StopHost) -> None:
        host = a.host_id
        if self.provisioner is None or host not in self.provisioner.managed() or host in self.draining:
            return
        why = await self.stoppable(host)
        if why:
            self.log.info("fleet_stop_deferred", host_id=host, why=why)
            return
        self.provisioner.stop(host)
        applied.add(1, {"kind": "stop_host", "outcome": "ok"})
        self.log.info("fleet_host_stopped", host_id=host)

    async def stoppable(self, host: str) -> str:
        """Why `host` may not be stopped yet ("" when it may), from fresh reads rather than the caches.

        The record goes to `drained` by CAS on exactly the revision checked: from then on no placement,
        failover or drain reserves room there (they take only `up` hosts), so no session can land after."""
        if any(host in pair for pair in self.busy.values()):
            return "a move, suspend or resume involving it is in flight"
        record, revision = await self.reservations.read(host)
        if record.state == "up":
            return "it is not draining"
        if record.sessions:
            return f"it holds {len(record.sessions)} reservations"
        entry = self.view.entry(host)
        if entry is not None and entry.sessions:
            return f"its heartbeat shows {entry.sessions} sessions"
        for s in self.view.owned(host):
            owner = await self.owners.view(s.session_id)
            if not owner.closed and owner.owner is not None and owner.owner.server_id == host:
                return f"it owns session {s.session_id}"
        try:
            fenced = await self.reservations.fence_drained(record, revision)
        except StatefleetError as e:  # any failure to fence it means: not now
            return f"its record could not be written ({e.code})"
        return "" if fenced else "its record changed meanwhile"


def _residents(fleet: Fleet) -> dict[str, int]:
    """Sessions on each host's device (serving, or moving away)."""
    out: dict[str, int] = {}
    for s in fleet.sessions:
        if s.state in ("serving", "moving"):
            out[s.host_id] = out.get(s.host_id, 0) + 1
    return out
