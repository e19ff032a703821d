"""Initial placement and resume targets: capacity- and path-aware, least loaded first.

Hosts are tried least busy first (ties by host_id), so the fleet's worst chunk latency grows
as slowly as it can. Among hosts that fit (the capacity verdict of `libs.contracts.estimate`,
reservations included), a host that stays within the latency target with the session
(`Params.latency_target_frac` of every resident's SLO) beats one that would not, and among
those the first whose fastest path out would admit a live move of this session wins: a session
placed there can still be moved later. A host past the target takes the session only when no
fitting host is within it: the guard band is the limit, the target is where placement aims.
"""

from __future__ import annotations

import math
from bisect import insort

from libs import admissibility
from libs.contracts import Estimate
from services.placement.policy import latency
from services.placement.policy.actions import Place, Refusal, Resume
from services.placement.policy.plan import HostLoad, Plan
from services.placement.policy.snapshot import Session


class Placer:
    """Keeps the open hosts ordered by load across the placements of one decision."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.order = sorted(plan.open_loads(), key=_key)
        self.profiles = list({id(hl.host.entry.profile): hl for hl in self.order}.values())  # one host per profile

    def choose(self, s: Session, prefer: str = "") -> tuple[HostLoad, Estimate] | str:
        """(host, estimate) for `s`, or the refusal reason. `prefer` is tried first (a resume's old host).

        Hosts are ranked: within the latency target with an admissible way out, within the target,
        then (only when no fitting host is within it) with a way out, then any that fits; least busy
        first within a rank. The preferred host wins its rank's ties.
        """
        plan = self.plan
        found: list[tuple[HostLoad, Estimate] | None] = [None, None, None, None]
        preferred = plan.loads.get(prefer)
        if preferred is not None and preferred.open:
            est = plan.fit(s, preferred)
            if est.fits:
                if plan.within_target(s, preferred):
                    return preferred, est
                found[2] = (preferred, est)  # staying beats a copy only when no host is within the target
        bound = self._target_busy(s)
        for hl in self.order:  # least busy first: once past `bound`, no host further on is within the target
            past = hl.busy > bound + 1e-9  # (a margin for rounding: `within_target` decides exactly)
            if past and (found[1] is not None or found[2] is not None):
                break
            est = plan.fit(s, hl)
            if not est.fits:
                continue
            rank = (0 if not past and plan.within_target(s, hl) else 2) + (0 if self._escapes(s, hl) else 1)
            if rank == 0:
                return hl, est
            if found[rank] is None:
                found[rank] = (hl, est)
        return next((f for f in found if f is not None), "no_fit")

    def _target_busy(self, s: Session) -> float:
        """The busiest a host can be and still take `s` within the latency target, over every profile
        the open hosts run (inf where the latency model does not bound it by load)."""
        bound = -math.inf
        for hl in self.profiles:
            t = self.plan.term(s, hl)
            if t is None:
                continue
            b = latency.busy_within(self.plan.params, t)
            if b - t.share > bound:
                bound = b - t.share
        return bound

    def commit(self, s: Session, hl: HostLoad, est: Estimate) -> None:
        self.order.remove(hl)
        self.plan.add(s, hl, est)
        insort(self.order, hl, key=_key)

    def _escapes(self, s: Session, hl: HostLoad) -> bool:
        rate = self.plan.escape_bps(hl)
        if rate <= 0:
            return False
        p = self.plan.params
        return admissibility.evaluate(admissibility.Move(
            state_bytes=s.state_bytes, dirty_rate_bps=s.dirty_rate_bps, horizon_s=p.move_horizon_s,
            bandwidth_bps=rate, setup_s=p.move_setup_s)).admissible


def _key(hl: HostLoad) -> tuple[float, str]:
    return (hl.busy, hl.host_id)


def place(placer: Placer, s: Session) -> Place | Refusal:
    got = placer.choose(s)
    if isinstance(got, str):
        return Refusal(kind="place", session_id=s.session_id, reason=got)
    hl, est = got
    placer.commit(s, hl, est)
    return Place(session_id=s.session_id, host_id=hl.host_id, busy_fraction=est.busy_fraction,
                 state_bytes=est.state_bytes)


def resume(placer: Placer, s: Session) -> Resume | Refusal:
    """Back onto its old host when that has room, else wherever placement would put it."""
    got = placer.choose(s, prefer=s.host_id)
    if isinstance(got, str):
        return Refusal(kind="resume", session_id=s.session_id, reason=got, host_id=s.host_id)
    hl, est = got
    placer.commit(s, hl, est)
    return Resume(session_id=s.session_id, host_id=hl.host_id, busy_fraction=est.busy_fraction,
                  state_bytes=est.state_bytes)
