"""Initial placement and resume targets: capacity- and path-aware, packed within the latency target.

Among hosts that fit (the capacity verdict of `libs.contracts.estimate`, reservations
included), a host that stays within the latency target with the session
(`Params.latency_target_frac` of every resident's SLO) beats one that would not, and among
those one whose fastest path out would admit a live move of this session wins: a session
placed there can still be moved later. Within the target the busiest such host wins (best
fit; ties by the most sessions held, then the lower host_id): light sessions pack together, so empty hosts stay empty for
the sessions that need a device nearly to themselves (under the profile model a tier-16
session's target leaves room for no co-tenant). A host past the target takes the session only
when no fitting host is within it, and then the least busy does, so the fleet's worst chunk
latency grows as slowly as it can: the guard band is the limit, the target is where placement
aims. `Placer(pack=False)` ranks the same way but least busy first within the target too (the
least-loaded baseline); `Placer(spread=True)` takes, within the best rank any host reaches, the
host holding the fewest sessions (failover and drain, which land many sessions at once). A session
pinned to a torch thread count is placed among the hosts running at that count first (`choose`).

The placement service runs this same function for new sessions, failover and drain
(`services/placement/choice.py` builds the snapshot from its fleet view); the simulator runs it
through `decide.react`.
"""

from __future__ import annotations

import math
from bisect import bisect_right, insort
from collections.abc import Callable, Iterator

from libs import admissibility
from libs.contracts import Estimate, device_key
from services.placement.policy import latency
from services.placement.policy.actions import Place, Refusal, Resume
from services.placement.policy.plan import HostLoad, Plan
from services.placement.policy.snapshot import Session

Among = Callable[[HostLoad], bool] | None  # the hosts one pass of `Placer.choose` looks at (None: every open one)


class Placer:
    """Keeps the open hosts ordered by load across the placements of one decision."""

    def __init__(self, plan: Plan, *, pack: bool = True, spread: bool = False) -> None:
        self.plan = plan
        self.pack = pack  # within the target, the busiest host first (False: the least busy, as a baseline)
        # Within a rank, the host holding the fewest sessions first (the rank's own order breaking ties): a
        # failover lands a dead host's sessions at once, and each restores before it serves, so one survivor
        # taking them all was the slowest reclaim (9.9 s for the last of seven under load) and the next
        # death's whole fleet; hosts sharing a device also read one pooled load, which `pack` cannot split.
        self.spread = spread
        # Scans run from either end of one order by load; among hosts equally loaded, the one already holding
        # the most sessions, then the lower host_id, is the busier end's: best fit then keeps a device shared
        # by several processes (one pooled load) on the process that already serves it, as the service's
        # placement always did, and on idle hosts takes the first by id.
        ids = sorted(hl.host_id for hl in plan.open_loads())
        self._rank = {hid: -i for i, hid in enumerate(ids)}
        self.order = sorted(plan.open_loads(), key=self._key)
        self.profiles = list({id(hl.host.entry.profile): hl for hl in self.order}.values())  # one host per profile

    def choose(self, s: Session, prefer: str = "", among: Among = None) -> tuple[HostLoad, Estimate] | str:
        """(host, estimate) for `s`, or the refusal reason. `prefer` is tried first (a resume's old host);
        only hosts `among` accepts are looked at (None: every open one).

        A session pinned to a thread count (`Session.threads`) is placed among the hosts running at that
        count first, as if they were the whole fleet, and among all hosts only if none of them takes it:
        a replay at another count gives other low bits, but a session served is better than one refused.
        """
        if s.threads:
            got = self._choose(s, prefer, lambda hl: hl.host.entry.threads == s.threads
                               and (among is None or among(hl)))
            if not isinstance(got, str):
                return got
        return self._choose(s, prefer, among)

    def _choose(self, s: Session, prefer: str, among: Among) -> tuple[HostLoad, Estimate] | str:
        """Hosts are ranked: within the latency target with an admissible way out, within the target,
        then (only when no fitting host is within it) with a way out, then any that fits; busiest
        first within the first two ranks (least busy with `pack=False`), least busy first in the
        last two. The preferred host wins its rank's ties. Only hosts `among` accepts are looked at."""
        plan = self.plan
        # With a latency cap nothing is placed past it: a session no host takes within it waits (the
        # autoscaler asks for hosts), unless it misses the cap even alone, when only an empty host will do.
        capped = plan.params.latency_cap_ms > 0
        if self.spread:
            return self._spread(s, among, capped)
        found: list[tuple[HostLoad, Estimate] | None] = [None, None, None, None]
        preferred = plan.loads.get(prefer)
        if preferred is not None and preferred.open and (among is None or among(preferred)):
            est = plan.fit(s, preferred)
            if est.fits:
                if plan.within_target(s, preferred):
                    return preferred, est
                if not capped:
                    found[2] = (preferred, est)  # staying beats a copy only when no host is within the target
        # Within the target: the busiest host that stays within it (best fit). Light sessions pack
        # together, so empty hosts stay empty for the sessions that need a device nearly to
        # themselves; a host no busier than `bound` is the only kind that can be within it.
        if capped and self.pack and plan.params.cap_least_waste:
            found[1] = self._least_waste(s, among)
        else:
            for hl, est in self.within(s, among):
                if self._escapes(s, hl):
                    return hl, est
                if found[1] is None:
                    found[1] = (hl, est)
        if found[1] is not None:
            return found[1]
        # Past the target: least busy first, so the fleet's worst chunk latency grows as slowly as it can.
        for hl in self.order:
            if found[2] is not None:
                break
            if (capped and (hl.n or hl.pending)) or (among is not None and not among(hl)):
                continue
            est = plan.fit(s, hl)
            if not est.fits:
                continue
            if not capped:
                hl, est = self._holder(s, hl, est, among)
            rank = 2 + (0 if self._escapes(s, hl) else 1)
            if found[rank] is None:
                found[rank] = (hl, est)
        return next((f for f in found if f is not None), "past_cap" if capped else "no_fit")

    def _least_waste(self, s: Session, among: Among) -> tuple[HostLoad, Estimate] | None:
        """With a cap: among the hosts within it (an admissible way out first), the one where `s` wastes
        the least room, then the busiest. A session's waste is the usable room (`Plan.spare`) it takes
        from its host beyond its own weight: under the colocation model a tier-4 session beside a lone
        tier-8 one fills the host (two sessions are the tier-8's limit) at 2/3 of its weight, where on an
        empty host or beside other tier-4 sessions it wastes nothing. Busiest-first alone made such mixed
        hosts (10.2 of 212.8 GPU-h on the generated workload, quick, seed 1, colocation model)."""
        plan = self.plan
        best: tuple[tuple[bool, float], HostLoad, Estimate] | None = None
        for hl, est in self.within(s, among):
            t = plan.term(s, hl)
            assert t is not None  # within the target
            w = plan.cap_kinds(t)[id(t)][1]
            kinds = tuple(hl.kinds.values())
            after = kinds if any(k is t for k in kinds) else (*kinds, t)
            waste = plan.spare(kinds, hl.busy, hl.n) - w - plan.spare(after, hl.busy + t.share, hl.n + 1)
            key = (not self._escapes(s, hl), round(max(0.0, waste), 6))
            if best is None or key < best[0]:
                best = (key, hl, est)
                if key == (False, 0.0):  # the busiest host that wastes nothing
                    break
        return None if best is None else (best[1], best[2])

    def _spread(self, s: Session, among: Among, capped: bool) -> tuple[HostLoad, Estimate] | str:
        """`spread`: the ranks of `_choose`, and within the best rank any host takes, the one holding the
        fewest sessions (its heartbeat's count plus its pending demand), then the rank's own order."""
        plan, order = self.plan, self.order
        best: tuple[tuple[int, int, int], HostLoad, Estimate] | None = None
        last = len(order) - 1
        for i, hl in enumerate(order):
            if among is not None and not among(hl):
                continue
            est = plan.fit(s, hl)
            if not est.fits:
                continue
            t = plan.term(s, hl)
            within = t is not None and hl.busy + t.share <= plan.room(hl) + 1e-9 and plan.within_target(s, hl)
            if capped and not within and (hl.n or hl.pending):
                continue
            rank = (0 if within else 2) + (0 if self._escapes(s, hl) else 1)
            position = (last - i if self.pack else i) if within else i
            key = (rank, hl.host.entry.sessions + len(hl.pending), position)
            if best is None or key < best[0]:
                best = (key, hl, est)
        if best is None:
            return "past_cap" if capped else "no_fit"
        return best[1], best[2]

    def _holder(self, s: Session, hl: HostLoad, est: Estimate, among: Among) -> tuple[HostLoad, Estimate]:
        """`hl`, or the process of its device already holding more of the device's sessions if that fits
        `s` too. Hosts of one device read one pooled load, so least busy first ties them, and the tie went
        to the one holding fewer: past the latency target a burst's last sessions landed on the device's
        idle process, splitting the device, which costs it more stage time per block than one process
        (docs/bench-colocation.md). Hosts without a machine (the simulator's) share no device."""
        if not hl.host.entry.machine:
            return hl, est
        key = device_key(hl.host.entry)
        best, held = (hl, est), hl.host.entry.sessions + len(hl.pending)
        for other in self.order:
            if other is hl or device_key(other.host.entry) != key or (among is not None and not among(other)):
                continue
            n = other.host.entry.sessions + len(other.pending)
            if n > held and (e := self.plan.fit(s, other)).fits:
                best, held = (other, e), n
        return best

    def within(self, s: Session, among: Among = None) -> Iterator[tuple[HostLoad, Estimate]]:
        """The fitting hosts that stay within the latency target with `s`, busiest first (`pack`).

        Only a host no busier than the target's bound can be within it, so the scan starts there.
        """
        plan, order = self.plan, self.order
        end = bisect_right(order, self._target_busy(s) + 1e-9, key=_busy)
        share = min((t.share for hl in self.profiles if (t := plan.term(s, hl)) is not None), default=0.0)
        for i in range(end - 1, -1, -1) if self.pack else range(end):
            hl = order[i]
            if among is not None and not among(hl):
                continue
            # a resident that could not take even the lightest share within its target rules the host out
            if hl.busy + share <= plan.room(hl) + 1e-9 and plan.within_target(s, hl):
                est = plan.fit(s, hl)
                if est.fits:
                    yield hl, est

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

    def _key(self, hl: HostLoad) -> tuple[float, int, int]:
        return (hl.busy, hl.host.entry.sessions + len(hl.pending), self._rank[hl.host_id])

    def commit(self, s: Session, hl: HostLoad, est: Estimate) -> None:
        self.order.remove(hl)
        self.plan.add(s, hl, est)
        insort(self.order, hl, key=self._key)

    def _escapes(self, s: Session, hl: HostLoad) -> bool:
        rate = self.plan.escape_bps(hl)
        if rate <= 0:
            return False
        p = self.plan.params
        return admissibility.evaluate(admissibility.Transfer(
            state_bytes=s.state_bytes, dirty_rate_bps=s.dirty_rate_bps, horizon_s=p.move_horizon_s,
            bandwidth_bps=rate, setup_s=p.move_setup_s)).admissible




def _busy(hl: HostLoad) -> float:
    return hl.busy


def place(placer: Placer, s: Session) -> Place | Refusal:
    got = placer.choose(s)
    if isinstance(got, str):
        return Refusal(kind="place", session_id=s.session_id, reason=got)
    hl, est = got
    placer.commit(s, hl, est)
    return Place(session_id=s.session_id, host_id=hl.host_id, busy_fraction=est.busy_fraction,
                 state_bytes=est.state_bytes)


def resume(placer: Placer, s: Session, among: Among = None) -> Resume | Refusal:
    """Back onto its old host when that has room, else wherever placement would put it, among the hosts
    `among` accepts (`offload.resumes`: those whose device's measured load has room for it)."""
    got = placer.choose(s, prefer=s.host_id, among=among)
    if isinstance(got, str):
        if among is not None and not isinstance(placer.choose(s, prefer=s.host_id), str):
            got = "measured_over_limit"  # a host's prices have room, but no device its measured load
        return Refusal(kind="resume", session_id=s.session_id, reason=got, host_id=s.host_id)
    hl, est = got
    placer.commit(s, hl, est)
    return Resume(session_id=s.session_id, host_id=hl.host_id, busy_fraction=est.busy_fraction,
                  state_bytes=est.state_bytes)
