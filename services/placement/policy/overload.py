"""Overload: a device measured past its limit is relieved in one decision, lower classes first.

Admission prices sessions by what their hosts measured, but a device can still carry more than its
limit: costs learned while serving rose, a noisy neighbour takes its cores. The host's own scheduler
acts first (it steps sessions down their ladders toward their floors). What is left over is read here
from the device's measured load (`EngineEntry.measured_fraction` summed over the hosts sharing it, not
the model's prices) and shed session by session until the rest fits, in the issue's order:

1. move a session live to a host on another device that has room (as a drain moves: owed, not chosen);
2. else, for a C5, C4, C3 and then C2b / C2a session, suspend it (`reason="overload"`): its state leaves
   the device and it resumes where there is room when input asks for it;
3. else, a C1 session no device can keep is suspended with `reason="capacity_lost"`, so the service
   says so in its summary (`statefleet status`) instead of serving it late.

A session's part of the measured load is its priced share scaled by the device's measured over priced
load: the device tells only its total.

A device's load here is what it measured, less what sessions shed within the measurement window still add
to it (`MeasuredRoom`); relief acts once it passes the limit by more than `overload_margin` (its noise), and
sheds down to the limit.

Resumes read the same measured load (`MeasuredRoom`): a suspended session resumes only onto a device
whose measured load, plus its share scaled the same way (never below its price), stays within the
limit. A session shed from a device then does not go back while that device is still past its limit
(it would be shed again at the next round); a `capacity_lost` C1 waits, re-queued, for a device with room.
"""

from __future__ import annotations

from libs.contracts import MEASURE_WINDOW_S, device_key
from services.placement.policy.actions import Move, Refusal, Suspend
from services.placement.policy.plan import HostLoad, Plan
from services.placement.policy.rebalance import admissible, move_off
from services.placement.policy.snapshot import Session

# Which sessions give way first: the classes that promise least (C1 last).
SHED_ORDER = {"C5": 0, "C4": 1, "C3": 2, "C2b": 3, "C2a": 4, "C1": 5}


class MeasuredRoom:
    """Each device's measured and priced load, and what this decision's resumes added to it."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.limit = 1.0 - plan.params.guard.busy_fraction
        self.measured: dict[str, float] = {}
        self.priced: dict[str, float] = {}
        # A device's priced load is the sum of its serving sessions' shares, the same terms each session's
        # part is scaled from (`cost`). The hosts' `busy_fraction` prices the same sessions at the curve's
        # marginal cost of the k-th, which a session's own share is not: dividing by it read each session's
        # part at half of what it ran, so relief shed five sessions where two would do (2026-12-07).
        for hl in plan.loads.values():
            key = device_key(hl.host.entry)
            self.measured[key] = self.measured.get(key, 0.0) + hl.host.entry.measured_fraction
            self.priced[key] = self.priced.get(key, 0.0) + sum(
                t.share for s in hl.residents if s.state == "serving" and (t := plan.term(s, hl)) is not None)
        # A session shed within the hosts' measurement window still has blocks in its device's measured load,
        # fading out over the window; counted there, relief shed again for an excess it had already removed
        # (`bench.c1_periods` 2026-12-07: C1 sessions shed and resumed up to three times a round).
        for s in plan.suspended:
            held = plan.loads.get(s.host_id)
            age = plan.fleet.now - s.suspended_at
            if s.shed and held is not None and 0.0 <= age < MEASURE_WINDOW_S:
                key = device_key(held.host.entry)
                self.measured[key] -= self.cost(s, held) * (1.0 - age / MEASURE_WINDOW_S)

    def over(self) -> dict[str, float]:
        """Each device measured past the limit (`1 - guard`) by more than `overload_margin`, with the load
        above the limit."""
        margin = self.plan.params.overload_margin
        return {d: m - self.limit for d, m in self.measured.items() if m > self.limit + margin}

    def cost(self, s: Session, hl: HostLoad) -> float:
        """`s`'s part of `hl`'s device's measured load, were it there: its priced share at the device's
        measured over priced load, and never less than the price (a device whose sessions barely ran yet
        measures little)."""
        key = device_key(hl.host.entry)
        t = self.plan.term(s, hl)
        priced = self.priced.get(key, 0.0)
        scale = max(1.0, self.measured.get(key, 0.0) / priced) if priced > 0 else 1.0
        return (t.share if t is not None else 0.0) * scale

    def admits(self, s: Session, hl: HostLoad) -> bool:
        key = device_key(hl.host.entry)
        return self.measured.get(key, 0.0) + self.cost(s, hl) <= self.limit + 1e-9

    def add(self, s: Session, hl: HostLoad) -> None:
        key = device_key(hl.host.entry)
        self.measured[key] = self.measured.get(key, 0.0) + self.cost(s, hl)


def relieve(plan: Plan) -> tuple[list[Move | Suspend], list[Refusal]]:
    actions: list[Move | Suspend] = []
    refusals: list[Refusal] = []
    room = MeasuredRoom(plan)
    over = room.over()
    for device in sorted(over):
        on = [hl for hl in plan.loads.values() if device_key(hl.host.entry) == device]
        priced = room.priced[device]
        scale = room.measured[device] / priced if priced > 0 else 1.0
        elsewhere = sorted((hl for hl in plan.open_loads() if device_key(hl.host.entry) not in over),
                           key=lambda h: (h.busy, h.host_id))
        excess = over[device]
        for s, src in _shed_order(plan, on):
            if excess <= 0:
                break
            share = plan.term(s, src)
            excess -= (share.share if share is not None else 0.0) * scale
            m = move_off(plan, s, src, elsewhere, admissible, receiver_limit=1, within_guard=False)
            if isinstance(m, Move):
                actions.append(m)
                continue
            refusals.append(m)
            plan.take_away(s, src)
            plan.claimed.add(s.session_id)
            actions.append(Suspend(session_id=s.session_id, host_id=src.host_id,
                                   reason="capacity_lost" if s.contract.session_class == "C1" else "overload"))
    return actions, refusals


def _shed_order(plan: Plan, on: list[HostLoad]) -> list[tuple[Session, HostLoad]]:
    """The device's serving sessions no earlier step acted on: lower classes first, the largest share
    first within a class (fewest sessions touched), then by id."""
    out = []
    for hl in on:
        for s in hl.residents:
            if s.state == "serving" and s.session_id not in plan.claimed:
                t = plan.term(s, hl)
                out.append((SHED_ORDER.get(s.contract.session_class, 0), -(t.share if t else 0.0), s.session_id, s, hl))
    return [(s, hl) for *_, s, hl in sorted(out, key=lambda x: x[:3])]
