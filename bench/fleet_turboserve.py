"""The TurboServe arm: its published scheduler, over the same snapshot, simulator and cost accounting as statefleet's.

Built to TurboServe's description (and the public mirror of its scheduler, as the issue restates
it), nothing borrowed from statefleet's policy but the snapshot's capacity verdicts:

- **K sessions per GPU**, and only *active* sessions placed: a session without input is offloaded to
  its host's memory at the next tick; when input comes back it resumes.
- **Placement** keeps a session where it is (a resume's old GPU) when that GPU has room, otherwise the
  least-loaded GPU with room; with none, it waits (queued, or suspended until a later tick).
  "Room": fewer than K active sessions and the capacity verdict (`libs.contracts.estimate`) fits.
- **Rebalancing**: at most `MOVES_PER_TICK` moves per tick, each only when the moved session's
  predicted chunk latency falls by more than `GAIN_MS` net of `COST_WEIGHT` × the migration cost
  (`MOVE_FIXED_MS` + size ÷ `MB_PER_MS`). Moves are stop-and-copy (the simulator freezes the session
  for the whole transfer at the path's rate: `Sim(stop_and_copy=True)`).
- **Budget** `M = max(⌈A/K⌉, ⌈A/(FILL·K)⌉)` GPUs over A active sessions (serving, queued or asking to
  resume); more are asked for at once, fewer are given back after `HOLD_S` below it (empty GPUs first,
  then the least loaded, whose sessions move off within the same per-tick move budget).

K comes from the latency cap both arms are held to: the most sessions of the workload's mean
session a GPU holds with its chunk within the cap (`sessions_per_gpu`). TurboServe sizes K from its
latency target the same way.
"""

from __future__ import annotations

import math

from bench.fleet_workload import SessionSpec
from services.placement.policy import (
    Decision,
    Drain,
    Fleet,
    Move,
    Params,
    Place,
    Refusal,
    Resume,
    ScaleOut,
    StopHost,
    Suspend,
)
from services.placement.policy import latency as lat
from services.placement.policy.autoscale import stops
from services.placement.policy.plan import HostLoad, Plan
from services.placement.policy.snapshot import Session

MOVES_PER_TICK = 3
GAIN_MS = 40.0
COST_WEIGHT = 0.35
MOVE_FIXED_MS = 8.0
MB_PER_MS = 32.0  # 32 MB/ms = 32 GB/s, TurboServe's migration-cost slope
FILL = 0.9
HOLD_S = 5.0


def migration_cost_ms(state_bytes: float) -> float:
    """TurboServe's migration-cost model: a fixed part plus the state at its copy rate."""
    return MOVE_FIXED_MS + state_bytes / 1e6 / MB_PER_MS


def sessions_per_gpu(specs: list[SessionSpec], params: Params, terms: dict[int, lat.Term], cap_ms: float) -> int:
    """K: the most sessions of the workload's mean session (its mean term) one GPU holds within `cap_ms`."""
    if not specs:
        return 1
    n = len(specs)
    mean = lat.Term(*(sum(getattr(terms[s.tier], f) for s in specs) / n for f in lat.Term._fields))
    k = 1
    while k < params.guard.max_sessions and lat.chunk_ms(params, mean, (k + 1) * mean.share, k + 1) <= cap_ms:
        k += 1
    return k


class TurboServe:
    """The arm's decision (every tick) and its reaction to an arrival or new input (`react`)."""

    def __init__(self, params: Params, k: int) -> None:
        self.params, self.k = params, k
        self.below_since: float | None = None  # when the budget first fell below the fleet (the hold)

    # ------------------------------------------------------------ placing active sessions

    def _room(self, plan: Plan, s: Session, hl: HostLoad):
        if not hl.open or hl.n >= self.k:
            return None
        est = plan.fit(s, hl)
        return est if est.fits else None

    def _least_loaded(self, plan: Plan, s: Session, skip: str = ""):
        for hl in sorted(plan.open_loads(), key=lambda h: (h.busy, h.n, h.host_id)):
            if hl.host_id != skip and (est := self._room(plan, s, hl)) is not None:
                return hl, est
        return None

    def _place_waiting(self, plan: Plan) -> tuple[list, list]:
        actions: list = []
        refusals: list = []
        wanting = [s for s in plan.suspended if s.last_input_at > s.suspended_at and s.session_id not in plan.claimed]
        for s in sorted(wanting, key=lambda x: (x.last_input_at, x.session_id)):
            home = plan.loads.get(s.host_id)
            got = (home, est) if home is not None and (est := self._room(plan, s, home)) is not None else None
            got = got or self._least_loaded(plan, s)
            if got is None:
                refusals.append(Refusal(kind="resume", session_id=s.session_id, reason="no_room", host_id=s.host_id))
                continue
            hl, est = got
            plan.add(s, hl, est)
            actions.append(Resume(session_id=s.session_id, host_id=hl.host_id, busy_fraction=est.busy_fraction,
                                  state_bytes=est.state_bytes))
        for s in plan.queued:
            got = self._least_loaded(plan, s)
            if got is None:
                refusals.append(Refusal(kind="place", session_id=s.session_id, reason="no_room"))
                continue
            hl, est = got
            plan.add(s, hl, est)
            actions.append(Place(session_id=s.session_id, host_id=hl.host_id, busy_fraction=est.busy_fraction,
                                 state_bytes=est.state_bytes))
        return actions, refusals

    def react(self, fleet: Fleet) -> Decision:
        actions, refusals = self._place_waiting(Plan(fleet, self.params))
        return Decision(actions=tuple(actions), refusals=tuple(refusals))

    # ------------------------------------------------------------ one tick

    def __call__(self, fleet: Fleet) -> Decision:
        plan = Plan(fleet, self.params)
        actions: list = self._offload(plan)
        placed, refusals = self._place_waiting(plan)
        actions += placed
        budget = MOVES_PER_TICK
        drains = self._drain_moves(plan, budget)
        actions += drains
        actions += self._rebalance(plan, budget - len(drains))
        actions += self._scale(plan, fleet, refusals)
        return Decision(actions=tuple(actions), refusals=tuple(refusals))

    def _offload(self, plan: Plan) -> list[Suspend]:
        out = []
        now = plan.fleet.now
        for hl in plan.loads.values():
            for s in list(hl.residents):
                if s.state == "serving" and s.last_input_at < now and s.session_id not in plan.claimed:
                    plan.take_away(s, hl)
                    plan.claimed.add(s.session_id)
                    out.append(Suspend(session_id=s.session_id, host_id=hl.host_id))
        return out

    def _move(self, plan: Plan, s: Session, src: HostLoad, dst: HostLoad, est, gain: float) -> Move:
        frozen = s.state == "suspended"
        rate = plan.fleet.paths.rate(src.host, dst.host)
        took = self.params.move_setup_s + s.state_bytes / rate
        if not frozen:
            plan.add(s, dst, est)
            plan.take_away(s, src)
        else:
            plan.claimed.add(s.session_id)
        dst.receiving += 1
        return Move(session_id=s.session_id, src=src.host_id, dst=dst.host_id,
                    busy_fraction=0.0 if frozen else est.busy_fraction, state_bytes=s.state_bytes, gain_ms=gain,
                    t_migrate_s=took, stall_ms=0.0 if frozen else 1e3 * took)

    def _drain_moves(self, plan: Plan, budget: int) -> list[Move]:
        out: list[Move] = []
        for src in sorted((hl for hl in plan.loads.values() if hl.host.state == "draining"), key=lambda h: h.host_id):
            for s in sorted(plan.draining.get(src.host_id, ()), key=lambda x: x.session_id):
                if len(out) >= budget:
                    return out
                if s.session_id in plan.claimed:
                    continue
                got = self._least_loaded(plan, s, skip=src.host_id) if s.state == "serving" else next(
                    ((hl, None) for hl in sorted(plan.open_loads(), key=lambda h: (h.busy, h.host_id))), None)
                if got is not None:
                    out.append(self._move(plan, s, src, got[0], got[1], 0.0))
        return out

    def _rebalance(self, plan: Plan, budget: int) -> list[Move]:
        """The best move by TurboServe's gain, up to `budget` times. A session's gain cannot exceed its
        chunk latency now less the cost term, so sources are scanned worst first and the scan stops where
        no session could pass; receivers are the least loaded with room (its latency only grows with load)."""
        p = self.params
        out: list[Move] = []
        for _ in range(max(0, budget)):
            best = None
            receivers = sorted(plan.open_loads(), key=lambda h: (h.busy, h.n, h.host_id))
            for src in sorted(plan.open_loads(), key=lambda h: (-h.ms, h.host_id)):
                if src.ms - COST_WEIGHT * MOVE_FIXED_MS <= GAIN_MS:
                    break
                for sid, t in sorted(plan.open_up(src).items()):
                    s = src.members[sid]
                    if s.state != "serving" or sid in plan.claimed:
                        continue
                    before = lat.chunk_ms(p, t, src.busy, src.n)
                    net = COST_WEIGHT * migration_cost_ms(s.state_bytes)
                    if before - net <= GAIN_MS:
                        continue
                    tried = 0
                    for dst in receivers:
                        if tried >= p.targets_per_session:
                            break
                        if dst is src or (est := self._room(plan, s, dst)) is None:
                            continue
                        tried += 1
                        gain = before - lat.chunk_ms(p, t, dst.busy + t.share, dst.n + 1) - net
                        if gain > GAIN_MS and (best is None or gain > best[0]):
                            best = (gain, s, src, dst, est)
            if best is None:
                break
            gain, s, src, dst, est = best
            out.append(self._move(plan, s, src, dst, est, gain))
        return out

    def _scale(self, plan: Plan, fleet: Fleet, waiting: list[Refusal]) -> list:
        p = self.params
        opens = plan.open_loads()
        active = sum(hl.n for hl in opens) + len(waiting)
        m = max(p.min_hosts, math.ceil(active / self.k), math.ceil(active / (FILL * self.k) - 1e-9))
        have = len(opens) + fleet.provisioning
        out: list = []
        if m > have:
            self.below_since = None
            out.append(ScaleOut(count=m - have))
        elif m < have:
            if self.below_since is None:
                self.below_since = fleet.now
            elif fleet.now - self.below_since >= HOLD_S:
                owned = set(plan.owned) | {hl.host_id for hl in plan.loads.values() if hl.receiving or hl.pending}
                order = sorted(opens, key=lambda h: (h.host_id in owned, h.busy, h.n, h.host_id))
                for hl in order[: min(have - m, len(opens))]:
                    out.append(Drain(host_id=hl.host_id))
                    if hl.host_id not in owned:  # nothing to move off: given back at once
                        out.append(StopHost(host_id=hl.host_id))
                self.below_since = None
        else:
            self.below_since = None
        return out + stops(plan)
