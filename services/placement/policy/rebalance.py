"""Migration-aware min-max rebalancing, and the moves a draining host is owed.

One round: find the bottleneck (the open host with the highest predicted chunk latency L),
try each of its movable sessions on the least loaded hosts that fit, and take the move with
the largest gain `Γ = L − L′ − η·κ` (L′: the fleet's worst latency after the move; κ: the
move's predicted freeze at cut-over) if Γ exceeds the threshold and the admissibility
calculator admits it on that path. Repeat from the new bottleneck, at most
`max_moves_per_round` times. A session moves at most `max_moves_per_window` times per window
and never within `move_cooldown_s` of its last move; no receiver takes more than
`receiver_moves_per_round` moves at once (one: no incast).

`admit` is the gate: the service passes `admissible` (the calculator); a baseline that moves
on hope passes `hoped`, which admits everything.
"""

from __future__ import annotations

from bisect import insort
from collections.abc import Callable

import msgspec

from libs.admissibility import MoveVerdict
from libs.contracts import Estimate
from services.placement.policy import latency
from services.placement.policy.actions import Move, Refusal
from services.placement.policy.plan import HostLoad, Plan
from services.placement.policy.snapshot import Session

Gate = Callable[[MoveVerdict], bool]


def admissible(v: MoveVerdict) -> bool:
    return v.admissible


def hoped(v: MoveVerdict) -> bool:
    return True


class _Candidate:
    __slots__ = ("session", "dst", "est", "gain", "verdict", "stall")

    def __init__(self, session: Session, dst: HostLoad, est: Estimate, gain: float, verdict: MoveVerdict,
                 stall: float) -> None:
        self.session, self.dst, self.est, self.gain, self.verdict, self.stall = session, dst, est, gain, verdict, stall


def rebalance(plan: Plan, *, admit: Gate = admissible, receiver_limit: int = 1) -> tuple[list[Move], list[Refusal]]:
    p = plan.params
    opens = plan.open_loads()
    moves: list[Move] = []
    refusals: list[Refusal] = []
    if len(opens) < 2:
        return moves, refusals
    order = sorted(opens, key=_key)
    moved: set[str] = set()
    for _ in range(p.max_moves_per_round):
        src = max(opens, key=_key)
        best = _best_move(plan, src, order, moved, admit, receiver_limit, refusals)
        if best is None:
            break
        moves.append(_apply(plan, src, best, order))
        moved.add(best.session.session_id)
    return moves, refusals


def _best_move(plan: Plan, src: HostLoad, order: list[HostLoad], moved: set[str], admit: Gate,
               receiver_limit: int, refusals: list[Refusal]) -> _Candidate | None:
    p = plan.params
    bottleneck = src.ms
    best: _Candidate | None = None
    for sid in sorted(plan.open_up(src)):
        s = src.members[sid]
        if sid in moved or not plan.movable(s):
            continue
        without = plan.ms_without(src, sid)
        refused = False
        tried = 0
        for dst in order:
            if dst.ms >= bottleneck or tried >= p.targets_per_session:
                break
            if dst is src or dst.receiving >= receiver_limit:
                continue
            est = plan.fit(s, dst)
            if not est.fits:
                continue
            tried += 1
            t = plan.term(s, dst)
            after = max(without, plan.ms_with(dst, t), _worst_other(order, src, dst))
            rate = plan.fleet.paths.rate(src.host, dst.host)
            stall = plan.stall_ms(s, rate, t.window_ms)
            gain = bottleneck - after - p.eta * stall
            # the moved session's chunk at cut-over (its latency on the receiver plus the freeze) must
            # not become the new worst chunk: min-max would then have made the maximum worse
            cut_over = plan.ms_with(dst, t) + stall
            if gain <= p.gain_threshold_ms or cut_over >= bottleneck or (p.latency_cap_ms and cut_over > p.latency_cap_ms):
                continue
            verdict = plan.move_verdict(s, src, dst)
            if not admit(verdict):
                if not refused:
                    refusals.append(Refusal(kind="move", session_id=sid, host_id=dst.host_id,
                                            reason=f"inadmissible: {verdict.reason}"))
                    refused = True
                continue
            if best is None or gain > best.gain:
                best = _Candidate(s, dst, est, gain, verdict, stall)
    return best


def _worst_other(order: list[HostLoad], a: HostLoad, b: HostLoad) -> float:
    """The highest latency among open hosts other than `a` and `b` (order is ascending)."""
    for hl in reversed(order):
        if hl is not a and hl is not b:
            return hl.ms
    return 0.0


def _apply(plan: Plan, src: HostLoad, c: _Candidate, order: list[HostLoad]) -> Move:
    order.remove(src)
    order.remove(c.dst)
    plan.add(c.session, c.dst, c.est)
    plan.take_away(c.session, src)
    c.dst.receiving += 1
    src.sending += 1
    insort(order, src, key=_key)
    insort(order, c.dst, key=_key)
    return Move(session_id=c.session.session_id, src=src.host_id, dst=c.dst.host_id,
                busy_fraction=c.est.busy_fraction, state_bytes=c.est.state_bytes, gain_ms=c.gain,
                t_migrate_s=c.verdict.t_migrate_s, stall_ms=c.stall)


def _key(hl: HostLoad) -> tuple[float, str]:
    return (hl.ms, hl.host_id)


def drain_moves(plan: Plan, *, admit: Gate = admissible, receiver_limit: int = 1,
                within_guard: bool = True) -> tuple[list[Move], list[Refusal]]:
    """Move every session off draining hosts: the least loaded fitting receiver whose path admits it.

    Suspended sessions move too (their host-memory copy, frozen: nothing dirties it). A serving
    session moves only where its chunk at cut-over (its latency on the receiver plus the freeze)
    is no later than the guard band lets its chunks be anyway (`within_guard`): scale-in gives
    capacity back, it must not make a chunk later than a host filled to the guard would. A
    session no receiver can take stays where it is this round, with the reason; the host waits.
    """
    moves: list[Move] = []
    refusals: list[Refusal] = []
    draining = sorted((hl for hl in plan.loads.values() if hl.host.state == "draining"), key=lambda h: h.host_id)
    if not draining or not plan.params.drain_by_moves:
        return moves, refusals
    order = sorted(plan.open_loads(), key=lambda h: (h.busy, h.host_id))
    for src in draining:
        for s in sorted(plan.draining.get(src.host_id, ()), key=lambda x: x.session_id):
            if s.session_id in plan.claimed:
                continue
            m = move_off(plan, s, src, order, admit, receiver_limit, within_guard)
            (moves if isinstance(m, Move) else refusals).append(m)
    return moves, refusals


def move_off(plan: Plan, s: Session, src: HostLoad, order: list[HostLoad], admit: Gate,
             receiver_limit: int, within_guard: bool) -> Move | Refusal:
    """`s` off `src` onto the first of `order` that fits it and whose path admits the move (a drain's
    and an overload's move: owed, not chosen for a gain), or why none does."""
    frozen = s.state == "suspended"
    probe = s if not frozen else _frozen(s)
    reason = "no_fit"
    for dst in order:
        if dst.receiving >= receiver_limit:
            reason = reason if reason != "no_fit" else "receivers_busy"
            continue
        est = plan.fit(s, dst)
        if not frozen and not est.fits:
            continue
        if not frozen and within_guard and not _cut_over_within_guard(plan, s, src, dst):
            reason = reason if reason != "no_fit" else "past_guard"
            continue
        if not frozen and plan.params.latency_cap_ms > 0 and not plan.within_target(s, dst):
            reason = reason if reason != "no_fit" else "past_cap"  # every resident stays within it too
            continue
        verdict = plan.move_verdict(probe, src, dst)
        if not admit(verdict):
            reason = f"inadmissible: {verdict.reason}"
            continue
        busy = 0.0 if frozen else est.busy_fraction
        if not frozen:
            order.remove(dst)
            plan.add(s, dst, est)
            plan.take_away(s, src)
            insort(order, dst, key=lambda h: (h.busy, h.host_id))
        dst.receiving += 1
        plan.claimed.add(s.session_id)
        rate = plan.fleet.paths.rate(src.host, dst.host)
        return Move(session_id=s.session_id, src=src.host_id, dst=dst.host_id, busy_fraction=busy,
                    state_bytes=s.state_bytes, gain_ms=0.0, t_migrate_s=verdict.t_migrate_s,
                    stall_ms=0.0 if frozen else plan.stall_ms(s, rate, s.contract.window_ms or 0.0))
    return Refusal(kind="drain", session_id=s.session_id, host_id=src.host_id, reason=reason)


def _cut_over_within_guard(plan: Plan, s: Session, src: HostLoad, dst: HostLoad) -> bool:
    """The chunk `s` makes at cut-over onto `dst` (its latency there plus the freeze) is no later than
    the guard band lets any of its chunks be (its latency on a host filled to the guard)."""
    t = plan.term(s, dst)
    if t is None:
        return False
    p = plan.params
    stall = plan.stall_ms(s, plan.fleet.paths.rate(src.host, dst.host), t.window_ms)
    limit = p.latency_cap_ms or latency.chunk_ms(p, t, 1.0 - p.guard.busy_fraction, p.guard.max_sessions)
    return latency.chunk_ms(p, t, dst.busy + t.share, dst.n + 1) + stall <= limit


def _frozen(s: Session) -> Session:
    return msgspec.structs.replace(s, dirty_rate_bps=0.0)
