"""One full fleet decision: resume, place, drain, relieve overload, suspend, rebalance, autoscale, in that order.

Each step sees what the earlier ones did through one `Plan`, so the decision as a whole never
over-commits a host and its moves (drain and rebalance together) share no receiver.
"""

from __future__ import annotations

from services.placement.policy.actions import Action, Decision, Place, Refusal
from services.placement.policy.autoscale import autoscale
from services.placement.policy.offload import resumes, suspends
from services.placement.policy.overload import relieve
from services.placement.policy.params import Params
from services.placement.policy.placement import Placer, place
from services.placement.policy.plan import Plan
from services.placement.policy.rebalance import drain_moves, rebalance
from services.placement.policy.snapshot import Fleet


def react(fleet: Fleet, params: Params) -> Decision:
    """What cannot wait for the next round: resumes new input asks for, then queued sessions' placements.

    The service runs this when a session arrives or input reaches a suspended session.
    """
    plan = Plan(fleet, params)
    placer = Placer(plan)
    actions: list[Action] = []
    refusals: list[Refusal] = []
    done, refused = resumes(plan, placer)
    actions += done
    refusals += refused
    for s in plan.queued:
        r = place(placer, s)
        (actions if isinstance(r, Place) else refusals).append(r)
    return Decision(actions=tuple(actions), refusals=tuple(refusals))


def decide(fleet: Fleet, params: Params, *, rebalancing: bool = True, scaling: bool = True,
           offload: bool = True, relieving: bool = False) -> Decision:
    plan = Plan(fleet, params)
    placer = Placer(plan)
    actions: list[Action] = []
    refusals: list[Refusal] = []
    still_queued = []
    if offload or relieving:  # relief's suspended sessions resume through the same step
        done, refused = resumes(plan, placer)
        actions += done
        refusals += refused
        # A re-queued `capacity_lost` session no device has room for yet is queued demand to the autoscaler.
        waiting = {r.session_id for r in refused}
        still_queued += [s for s in plan.suspended if s.shed == "capacity_lost" and s.session_id in waiting]
    for s in plan.queued:
        r = place(placer, s)
        if isinstance(r, Place):
            actions.append(r)
        else:
            refusals.append(r)
            still_queued.append(s)
    moves, refused = drain_moves(plan)
    actions += moves
    refusals += refused
    if relieving:  # before idle offload and rebalancing: a device past its limit is owed relief first
        shed, refused = relieve(plan)
        actions += shed
        refusals += refused
    if offload:
        actions += suspends(plan)
    if rebalancing:
        moves, refused = rebalance(plan)
        actions += moves
        refusals += refused
    seen = None
    if scaling:
        scaled, seen = autoscale(plan, still_queued)
        actions += scaled
    return Decision(actions=tuple(actions), refusals=tuple(refusals), scaling=seen)
