"""One policy: the service's fleet controller and the simulator decide the same on the same fleet snapshots.

The simulator's statefleet arm runs on a generated workload and its snapshots are recorded. Each one is
decided again the way the fleet controller decides (`policy.decide` on the knobs its config yields, with
the controller's flags), and the decisions must be the same action for action. The simulator runs with
the benchmark's knobs, so this fails wherever a knob the benchmark's policy uses cannot be set through the
service config, or is set differently there.
"""

from __future__ import annotations

import msgspec

from bench import fleet, fleet_arms
from bench.fleet_sim import GUARD, Sim
from services.placement.control_config import FleetControlConfig
from services.placement.policy import Params, decide

TINY = {"concurrency": 12, "request_span_s": None, "servegen_span_s": 1200.0, "generated_span_s": 900.0}


def controller_params(p: Params) -> tuple[Params, dict]:
    """The knobs and flags the fleet controller decides with, from a config carrying every knob of `p` that
    the config has a field for."""
    fields = {f.name for f in msgspec.structs.fields(FleetControlConfig)}
    cfg = FleetControlConfig(**{k: v for k, v in msgspec.structs.asdict(p).items() if k in fields})
    return cfg.params(GUARD), {"rebalancing": cfg.rebalance, "scaling": True, "offload": cfg.keep_warm_s > 0}


def recorded(p: Params) -> list[tuple]:
    _, specs, _ = fleet.workload(None, 4, TINY)
    _, _, end = fleet.offered(specs)
    seen: list[tuple] = []
    arm = fleet_arms.policy(p)

    def decide_and_record(snap):
        d = arm(snap)
        seen.append((snap, d))
        return d
    Sim(specs, decide_and_record, p, p.min_hosts + p.warm_pool_hosts, fleet.TICK_S, end, "statefleet",
        lambda *a: None, fleet_arms.reacting(p)).run()
    return seen


def same_decisions(p: Params) -> bool:
    q, flags = controller_params(p)
    seen = recorded(p)
    assert len(seen) > 100
    return all(decide(snap, q, **flags).actions == d.actions for snap, d in seen)


def test_with_the_knobs_the_service_can_set_the_controller_and_the_simulator_decide_alike():
    """Every knob at a value the service config can express (the service's own drain_by_moves=False and
    defaults): the same sequence of snapshots gives the same decisions, action for action."""
    q, _ = controller_params(msgspec.structs.replace(fleet.params("profile"), latency_cap_ms=0.0))
    assert same_decisions(msgspec.structs.replace(q, guard=GUARD))


def test_with_the_benchmarks_knobs_the_controller_and_the_simulator_decide_alike():
    assert same_decisions(fleet.params("profile"))
