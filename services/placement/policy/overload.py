"""Overload, acted on: a device whose load at its measured capacity passes the limit gives sessions up.

A device's load is priced from its `DeviceCapacity` (libs/capacity_model.py) over every session its
hosts hold, at the device's concurrency. Admission never admits past the limit, but the load can pass
it anyway: serving learns the curve is higher than start-up measured (a noisy neighbour, a slowing
device). The engine host first steps its sessions down their ladders within their floors (its
scheduler does that by itself, every pick); what is left over the limit at the floors is this
policy's, in this order, until the device is back within the limit:

1. live-move sessions to a device with room (lower classes first: a C1 keeps its host while others can
   go), on an admissible path;
2. suspend bulk sessions (C3, C4, C5), then C2 (the suspension keeps their state; they resume later);
3. a C1 session that still cannot be kept is suspended and re-queued with the reason `capacity_lost`:
   admission owes its client a typed event, and status shows it. Never silently late.

Pure: the caller (the fleet controller) applies the actions it returns.
"""

from __future__ import annotations

from collections.abc import Callable

from libs import capacity_model as cm
from libs.contracts import Guard, device_key, floor_row
from libs.schemas.capacity import DeviceCapacity, Kind
from libs.session_classes import BULK_ORDER, PERIODIC
from services.placement.policy.actions import Move, Refusal, Requeue, Suspend
from services.placement.policy.plan import HostLoad, Plan
from services.placement.policy.rebalance import admissible
from services.placement.policy.snapshot import Session

# Who gives way first: moved or suspended in this order (C1 last).
YIELD_ORDER = (*reversed(BULK_ORDER), *reversed(PERIODIC))
CAPACITY_LOST = "capacity_lost"


def kind_of(s: Session, hl: HostLoad) -> Kind:
    row = floor_row(hl.host.entry.profile, s.backend, s.contract.quality_floor)
    return Kind(backend=s.backend, tier=row.tier if row else s.contract.quality_floor,
                window_ms=s.contract.window_ms or 0.0, blocks_per_window=s.contract.blocks_per_window)


def device_load(cap: DeviceCapacity, kinds: list[Kind]) -> float:
    return cm.load(cap, cm.merge(kinds))


def relieve(plan: Plan, guard: Guard, *, admit: Callable[..., bool] = admissible,
            receiver_limit: int = 4) -> tuple[list[Move | Suspend | Requeue], list[Refusal]]:
    """The actions that bring every overloaded device back within `1 − guard` at its measured capacity.
    A session that could move but finds every receiver busy this round is given up by nobody: the next
    round moves it."""
    limit = 1.0 - guard.busy_fraction
    devices: dict[str, list[HostLoad]] = {}
    for hl in plan.loads.values():
        devices.setdefault(device_key(hl.host.entry), []).append(hl)
    actions: list[Move | Suspend | Requeue] = []
    refusals: list[Refusal] = []
    for dev in sorted(devices):
        hosts = devices[dev]
        cap = max((h.host.entry.capacity for h in hosts if h.host.entry.capacity is not None),
                  key=lambda c: c.updated_at, default=None)
        if cap is None:
            continue
        members = [(s, hl) for hl in hosts for s in hl.residents
                   if s.state == "serving" and s.session_id not in plan.claimed]
        kinds = {s.session_id: kind_of(s, hl) for s, hl in members}
        if device_load(cap, list(kinds.values())) <= limit + 1e-9:
            continue
        order = sorted(members, key=lambda m: (YIELD_ORDER.index(m[0].contract.session_class), m[0].session_id))
        others = [hl for d, hls in devices.items() if d != dev for hl in hls if hl.open]

        waits = False
        for s, src in order:  # 1. moves to a device with room
            if device_load(cap, list(kinds.values())) <= limit + 1e-9:
                break
            m = _move(plan, s, src, others, admit, receiver_limit)
            if isinstance(m, Move):
                actions.append(m)
                del kinds[s.session_id]
            else:
                refusals.append(m)
                waits |= m.reason == "receivers_busy"
        for s, src in ([] if waits else order):  # 2. suspend lower classes; 3. C1 re-queued with capacity_lost
            if device_load(cap, list(kinds.values())) <= limit + 1e-9:
                break
            if s.session_id not in kinds:
                continue
            plan.claimed.add(s.session_id)
            del kinds[s.session_id]
            if s.contract.session_class == "C1":
                actions.append(Requeue(session_id=s.session_id, host_id=src.host_id, reason=CAPACITY_LOST))
            else:
                actions.append(Suspend(session_id=s.session_id, host_id=src.host_id))
    return actions, refusals


def _move(plan: Plan, s: Session, src: HostLoad, others: list[HostLoad], admit: Callable[..., bool],
          receiver_limit: int) -> Move | Refusal:
    reason = "no_fit"
    for dst in sorted(others, key=lambda h: (h.busy, h.host_id)):
        if dst.receiving >= receiver_limit:
            reason = "receivers_busy"
            continue
        est = plan.fit(s, dst)
        if not est.fits:
            continue
        verdict = plan.move_verdict(s, src, dst)
        if not admit(verdict):
            reason = f"inadmissible: {verdict.reason}"
            continue
        plan.add(s, dst, est)
        plan.take_away(s, src)
        dst.receiving += 1
        rate = plan.fleet.paths.rate(src.host, dst.host)
        return Move(session_id=s.session_id, src=src.host_id, dst=dst.host_id, busy_fraction=est.busy_fraction,
                    state_bytes=s.state_bytes, gain_ms=0.0, t_migrate_s=verdict.t_migrate_s,
                    stall_ms=plan.stall_ms(s, rate, s.contract.window_ms or 0.0))
    return Refusal(kind="move", session_id=s.session_id, host_id=src.host_id, reason=reason)
