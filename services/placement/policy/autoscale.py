"""Load-driven autoscaling with hysteresis and cooldowns. Scale-in is a drain; stopping the host waits for it to be empty.

Utilisation is the open hosts' busy fraction (measured plus reserved, as `libs.contracts`
counts it) plus what queued sessions would add, over the open and provisioning hosts. Above
`scale_out_above` (or with anything queued, or the pre-warmed pool short) it asks for enough
hosts to bring the fleet to `target_util` plus the pool, and for sessions still queued after
placement (they fit no open host) hosts beyond the open ones for their load (at least one),
those already coming included; below `scale_in_below` it drains the least loaded hosts down to
that size, never within `scale_in_cooldown_s` of the last scaling in either direction, and
never while hosts are still being provisioned. A draining host is stopped only once it owns
no session (serving, moving or suspended) and expects none.

With a latency cap, demand is in hosts at the cap, and placement packs each host to the cap: a host
in use counts whole (its room is what its sessions leave within the cap), so the fleet wants the hosts
in use plus the queued sessions' hosts plus the pool, and it scales in once the idle hosts are more than
the pool over `cap_scale_in_below`, not at a fixed utilisation of the hosts kept.
"""

from __future__ import annotations

import math

from libs.contracts import demand
from services.placement.policy import latency
from services.placement.policy.actions import Drain, ScaleOut, Scaling, StopHost
from services.placement.policy.plan import HostLoad, Plan
from services.placement.policy.snapshot import Session


def queued_load(plan: Plan, queued: list[Session]) -> float:
    """Busy fraction the queued sessions would add, at the rows of the first open host that offers each."""
    total = 0.0
    opens = plan.open_loads()
    for s in queued:
        for hl in opens:
            row = plan.row(s, hl)
            if row is not None:
                total += demand(s.contract, row).busy_fraction
                break
    return total


def _lead_hosts(plan: Plan, opens: list[HostLoad], load: float, aim: float) -> int:
    """Hosts the sessions arriving within one scale-out's lead time need, at the fleet's mean demand per
    session (`load` over its sessions, filled to `aim`): a new host cannot serve before then, so the pool
    must already hold them."""
    p = plan.params
    rate = max(plan.fleet.arrivals_per_s, plan.fleet.arrivals_peak_per_s)
    n = sum(hl.n for hl in opens)
    if rate <= 0 or not n:
        return 0
    return math.ceil(rate * p.provision_lead_s * (load / n) / aim - 1e-9)


def cap_load(plan: Plan, opens: list[HostLoad], queued: list[Session]) -> tuple[float, float]:
    """With a latency cap, demand in hosts at the cap (`latency.cap_weight` per session): (resident, queued)."""
    p = plan.params
    weights: dict[int, float] = {}
    for hl in opens:
        plan.open_up(hl)
    waiting_terms = [next((t for hl in opens if (t := plan.term(s, hl)) is not None), None) for s in queued]
    shares = [k.share for hl in opens for k in hl.kinds.values()] + [t.share for t in waiting_terms if t is not None]
    lightest = min(shares, default=0.0)
    resident = 0.0
    for hl in opens:
        assert hl.counts is not None
        for k, c in hl.counts.items():
            w = weights.get(k)
            if w is None:
                w = weights[k] = latency.cap_weight(p, hl.kinds[k], lightest)
            resident += c * w
    waiting = sum(latency.cap_weight(p, t, lightest) if t is not None else 1.0 for t in waiting_terms)
    return resident, waiting


def owners(plan: Plan) -> set[str]:
    """Hosts that own a session: it is resident, suspended in their memory, or moving to or from them."""
    out = set(plan.owned)
    out.update(hl.host_id for hl in plan.loads.values() if hl.receiving or hl.pending)
    return out


def stops(plan: Plan) -> list[StopHost]:
    owned = owners(plan)
    return [StopHost(host_id=hl.host_id) for hl in sorted(plan.loads.values(), key=lambda h: h.host_id)
            if hl.host.state in ("draining", "drained") and hl.host_id not in owned]


def measure(plan: Plan, queued: list[Session]) -> Scaling:
    """The fleet's utilisation as the autoscaler judges it, and the host count it aims at."""
    p, fleet = plan.params, plan.fleet
    opens = plan.open_loads()
    if p.latency_cap_ms > 0:  # demand in hosts at the cap, aiming to fill cap_fill of them
        resident, waiting = cap_load(plan, opens, queued)
        aim = p.cap_fill
    else:  # demand in device time, aiming at target_util
        resident, waiting = sum(hl.busy for hl in opens), queued_load(plan, queued)
        aim = p.target_util
    load = resident + waiting
    have = len(opens) + fleet.provisioning
    busy_hosts = math.ceil(load / aim - 1e-9)
    if p.latency_cap_ms > 0:  # placement packs each host to the cap: the hosts in use are full as their
        # sessions let them be, and only new arrivals need more (the pool below)
        in_use = sum(1 for hl in opens if hl.n or hl.pending)
        busy_hosts = max(in_use, math.ceil(resident - 1e-9)) + math.ceil(waiting / aim - 1e-9)
    # With a cap nothing is offloaded, so nothing resumes into the pool, and the lead term sizes it for the
    # arrivals: a share of the fleet on top is a fixed utilisation margin, which held ~10 % of the hosts in
    # use empty and changed no session's wait on the generated workload (docs/decisions.md).
    frac = p.warm_pool_frac if p.latency_cap_ms <= 0 else 0.0
    pool = max(p.warm_pool_hosts, math.ceil(frac * busy_hosts), _lead_hosts(plan, opens, resident, aim))
    want = max(p.min_hosts, busy_hosts + pool)
    if queued:  # they fit no open host now (memory, slots, or load), whatever the fleet's average says;
        # hosts already coming count towards them
        want = max(want, len(opens) + max(1, math.ceil(waiting / aim - 1e-9)))
    want = min(p.max_hosts, want)
    idle_hosts = sum(1 for hl in opens if not hl.n and not hl.pending) + fleet.provisioning
    return Scaling(load=load, hosts=have, util=load / have if have else math.inf, want=want, pool=pool,
                   idle_hosts=idle_hosts, queued=len(queued))


def autoscale(plan: Plan, queued: list[Session]) -> tuple[list[ScaleOut | Drain | StopHost], Scaling]:
    p, fleet = plan.params, plan.fleet
    m = measure(plan, queued)
    owned = owners(plan)
    out: list[ScaleOut | Drain | StopHost] = []
    above, below = (p.cap_fill, p.cap_scale_in_below) if p.latency_cap_ms > 0 else (p.scale_out_above,
                                                                                  p.scale_in_below)
    short = m.util > above or bool(queued) or m.idle_hosts < m.pool
    if short and m.hosts < m.want and fleet.now - fleet.last_scale_out_at >= p.scale_out_cooldown_s:
        out.append(ScaleOut(count=m.want - m.hosts))
    # Scale-in waits its cooldown after the last scaling either way: a host asked for in a wave boots
    # after it (60 s), and the next wave often follows within minutes; given back at once, it is not there.
    elif ((m.idle_hosts * below > m.pool if p.latency_cap_ms > 0 else m.util < below)
          and m.hosts > m.want and fleet.provisioning == 0 and not queued
          and fleet.now - max(fleet.last_scale_in_at, fleet.last_scale_out_at) >= p.scale_in_cooldown_s):
        for hl in _drain_order(plan.open_loads(), owned)[: m.hosts - m.want]:
            out.append(Drain(host_id=hl.host_id))
            if hl.host_id not in owned:
                out.append(StopHost(host_id=hl.host_id))
    return out + stops(plan), m


def _drain_order(opens: list[HostLoad], owned: set[str]) -> list[HostLoad]:
    """Empty hosts first, then the least busy: the fewest live moves for the capacity given back."""
    return sorted(opens, key=lambda hl: (hl.host_id in owned, hl.busy, hl.n, hl.host_id))
