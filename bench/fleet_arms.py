"""The arms the fleet benchmark compares, each a decision function over the same snapshot type.

statefleet's own arms call `services.placement.policy` (the functions the service applies);
the baselines compose the same pieces differently, or stand in for what exists without them:

- static peak / static average: a fixed fleet sized for the offered load's peak / mean at the
  guard band, first fit in host-id order (the placement service before this issue), no moves;
- migration only: the static-peak fleet with statefleet's placement and min-max rebalancing;
- autoscaling only: statefleet's placement and autoscaler, no rebalancing, no offload, and a
  draining host waits for its sessions to end (no live moves at all);
- joint greedy (TurboServe-style): least-loaded placement (on arrival too), gain-function rebalancing without
  the admissibility gate or the receiver rule (moves are hoped for), and
  `M = max(⌈N/K⌉, ⌈N/(K·ρ̂)⌉)` hosts for N sessions, K per GPU, ρ̂ its target fill;
- statefleet: `policy.decide` with everything on.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import msgspec

from libs.contracts import demand
from services.placement.policy import Decision, Drain, Fleet, Params, Place, ScaleOut, decide, react
from services.placement.policy.actions import Refusal
from services.placement.policy.autoscale import owners, releases
from services.placement.policy.placement import Placer, place
from services.placement.policy.plan import Plan
from services.placement.policy.rebalance import drain_moves, hoped, rebalance

UNBOUNDED = 1 << 30


def first_fit(params: Params) -> Callable[[Fleet], Decision]:
    def run(fleet: Fleet) -> Decision:
        plan = Plan(fleet, params)
        ordered = sorted(plan.open_loads(), key=lambda hl: hl.host_id)
        actions, refusals = [], []
        for s in fleet.sessions:
            if s.state != "queued":
                continue
            for hl in ordered:
                est = plan.fit(s, hl)
                if est.fits:
                    plan.add(s, hl, est)
                    actions.append(Place(session_id=s.session_id, host_id=hl.host_id,
                                         busy_fraction=est.busy_fraction, state_bytes=est.state_bytes))
                    break
            else:
                refusals.append(Refusal(kind="place", session_id=s.session_id, reason="no_fit"))
        return Decision(actions=tuple(actions), refusals=tuple(refusals))
    return run


def policy(params: Params, **parts: bool) -> Callable[[Fleet], Decision]:
    return lambda fleet: decide(fleet, params, **parts)


def reacting(params: Params) -> Callable[[Fleet], Decision]:
    return lambda fleet: react(fleet, params)


def greedy(params: Params) -> Callable[[Fleet], Decision]:
    """The joint greedy baseline: count-based autoscaling and ungated gain-function moves."""
    rho = params.target_util / (1.0 - params.guard.busy_fraction)  # fill K to the same device target

    def run(fleet: Fleet) -> Decision:
        plan = Plan(fleet, params)
        actions, refusals = _least_loaded(plan, fleet)
        for step in (drain_moves(plan, admit=hoped, receiver_limit=UNBOUNDED, within_guard=False),
                     rebalance(plan, admit=hoped, receiver_limit=UNBOUNDED)):
            actions += step[0]
            refusals += step[1]
        actions += _count_scaling(plan, fleet, rho)
        return Decision(actions=tuple(actions), refusals=tuple(refusals))
    return run


def greedy_reacting(params: Params) -> Callable[[Fleet], Decision]:
    """The greedy baseline's answer to an arrival: least-loaded placement, nothing else."""
    def run(fleet: Fleet) -> Decision:
        actions, refusals = _least_loaded(Plan(fleet, params), fleet)
        return Decision(actions=tuple(actions), refusals=tuple(refusals))
    return run


def _least_loaded(plan: Plan, fleet: Fleet) -> tuple[list, list]:
    placer = Placer(plan, pack=False)
    actions, refusals = [], []
    for s in fleet.sessions:
        if s.state == "queued":
            r = place(placer, s)
            (actions if isinstance(r, Place) else refusals).append(r)
    return actions, refusals


def _count_scaling(plan: Plan, fleet: Fleet, rho: float) -> list:
    p = plan.params
    live = [s for s in fleet.sessions if s.state != "suspended"]
    opens = plan.open_loads()
    if not live or not opens:
        n_hosts = len(opens) + fleet.provisioning
        return [ScaleOut(count=p.min_hosts - n_hosts)] if n_hosts < p.min_hosts else releases(plan)
    shares = [demand(s.contract, r).busy_fraction for s in live if (r := plan.row(s, opens[0])) is not None]
    k = max(1, math.floor((1.0 - p.guard.busy_fraction) / (sum(shares) / len(shares))))
    n = len(live)
    m = max(p.min_hosts, math.ceil(n / k), math.ceil(n / (k * rho)))
    have = len(opens) + fleet.provisioning
    out: list = []
    if m > have and fleet.now - fleet.last_scale_out_at >= p.scale_out_cooldown_s:
        out.append(ScaleOut(count=m - have))
    elif m < have and fleet.provisioning == 0 and fleet.now - fleet.last_scale_in_at >= p.scale_in_cooldown_s:
        owned = owners(plan)
        for hl in sorted(opens, key=lambda h: (h.host_id in owned, h.busy, h.host_id))[: have - m]:
            out.append(Drain(host_id=hl.host_id))
    return out + releases(plan)


def autoscaling_only_params(params: Params) -> Params:
    return msgspec.structs.replace(params, drain_by_moves=False, keep_warm_s=0.0)
