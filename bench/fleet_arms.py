"""The arms the fleet benchmark compares, each a decision function over the same snapshot type.

statefleet's arms call `services.placement.policy` (the functions the service applies);
the baselines compose the same pieces differently, or stand in for what exists without them:

- static peak / static average: a fixed fleet of the hosts a first-fit replay of the trace needs to
  drop nothing / of the offered load's mean at the guard band, first fit in host-id order (the
  placement service before the fleet work), no moves;
- migration only: the static-peak fleet with statefleet's placement and min-max rebalancing;
- autoscaling only: statefleet's placement and autoscaler, no rebalancing, no offload, and a
  draining host waits for its sessions to end (no live moves at all);
- TurboServe: its own scheduler, built to its published description (`bench/fleet_turboserve.py`);
- statefleet: `policy.decide` with everything on.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from libs.contracts import Demand, estimate
from services.placement.policy import Decision, Fleet, Params, Place, decide, react
from services.placement.policy.actions import Refusal


def first_fit(params: Params) -> Callable[[Fleet], Decision]:
    """First fit in host-id order by `libs.contracts.estimate`, each placement pending on its host for the
    rest of the decision. It needs no `Plan` (latency terms, zones): a static arm's snapshot has nothing
    queued on most events, and then the decision is empty at once."""
    def run(fleet: Fleet) -> Decision:
        queued = [s for s in fleet.sessions if s.state == "queued"]
        if not queued:
            return Decision(actions=())
        ordered = sorted((h for h in fleet.hosts if h.state == "up"), key=lambda h: h.host_id)
        pending = [list(h.reserved) for h in ordered]
        actions, refusals = [], []
        # A host that fails a (backend, contract) fails it for the rest of the decision (placing only adds
        # demand), so each such pair's scan resumes where its last one stopped: an undersized fleet with a
        # long queue otherwise re-tests every full host for every queued session.
        first: dict[tuple[str, int], int] = {}
        for s in queued:
            key = (s.backend, id(s.contract))
            j = first.get(key, 0)
            while j < len(ordered):
                est = estimate(s.contract, s.backend, ordered[j].entry, pending[j], params.guard)
                if est.fits:
                    pending[j].append(Demand(busy_fraction=est.busy_fraction, state_bytes=est.state_bytes))
                    actions.append(Place(session_id=s.session_id, host_id=ordered[j].host_id,
                                         busy_fraction=est.busy_fraction, state_bytes=est.state_bytes))
                    break
                j += 1
            else:
                refusals.append(Refusal(kind="place", session_id=s.session_id, reason="no_fit"))
            first[key] = j
        return Decision(actions=tuple(actions), refusals=tuple(refusals))
    return run


def policy(params: Params, **parts: bool) -> Callable[[Fleet], Decision]:
    return lambda fleet: decide(fleet, params, **parts)


def reacting(params: Params) -> Callable[[Fleet], Decision]:
    return lambda fleet: react(fleet, params)


def autoscaling_only_params(params: Params) -> Params:
    return msgspec.structs.replace(params, drain_by_moves=False, keep_warm_s=0.0)
