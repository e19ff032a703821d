"""A survivor that learned a high price while loaded, then idled, takes a failed-over session again (issue 29).

What the full `bench.failover --hog 2` run lost 283 acknowledged inputs to: a host served sessions while
two other stacks loaded the machine, learned a block price above the sessions' period, and its sessions
left. With nothing run since, the learned price never changed, so every failover sweep found it refusing
the stranded sessions as `period` until the run ended. Here the host's own heartbeat rows
(`refreshed_profile`, from its cost model, on an injected clock) go through failover's placement."""

from __future__ import annotations

from libs.contracts import Contract, Guard
from libs.schemas.common import EngineEntry, ProfileRow
from libs.schemas.fence import Owner, SessionView
from services.engine_host.costs import HALF_LIFE_S, IDLE_S, shape_of
from services.engine_host.runtime import EngineRuntime
from services.placement.failover import Orphan, Reassign, Stranded, plan
from services.placement.policy import Params, PathRates

C1 = Contract(session_class="C1", quality_floor=1, determinism="T0", period_ms=200.0)
ROW = ProfileRow(backend="world", tier=1, quantum_ms=10.0, block_ms=20.0, state_bytes=1 << 20,
                 media_s_per_block=0.1, colocated=[20.0, 30.0])


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def survivor(rt: EngineRuntime) -> EngineEntry:
    """The host's heartbeat as placement reads it: idle, its rows at the prices it has learned."""
    return EngineEntry(host_id="e1", device="cpu", memory_bytes=1 << 34, free_memory_bytes=1 << 34,
                       incarnation="e1-1", heartbeat_s=0.5, machine="m1", busy_fraction=rt.busy_fraction(),
                       profile=rt.refreshed_profile([ROW]))


def failover_to(rt: EngineRuntime) -> Reassign | Orphan:
    view = SessionView(owner=Owner(server_id="e0", version=3), claim=Owner(server_id="e0", version=3),
                       incarnation="e0-1")
    [decision] = plan([Stranded("s0", view, C1, "world")], [survivor(rt)], {}, Params(guard=Guard()),
                      settle_s=5.0, now=0.0, paths=PathRates(default_bps=1e9))
    return decision


def test_an_idle_survivor_that_learned_a_high_price_takes_the_stranded_session_again():
    clock = Clock()
    rt = EngineRuntime("cpu", host_id="e1", clock=clock)
    rt.seed_costs([ROW])
    shape = shape_of(rt.backend("world"))
    for _ in range(30):  # served beside a noisy neighbour: every block 400 ms, twice the period
        clock.now += 0.2
        rt.costs.learn(shape, 1, 1, 0.400)
    refused = failover_to(rt)
    assert isinstance(refused, Orphan) and [e.reason for e in refused.estimates] == ["period"]
    clock.now += IDLE_S + 8 * HALF_LIFE_S  # its sessions left; nothing ran here since
    taken = failover_to(rt)
    assert isinstance(taken, Reassign) and taken.host_id == "e1"
