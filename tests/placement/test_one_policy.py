"""One placement function (issues 23, 24): on the same randomized fleets, the placement service's chooser
(`services/placement/choice.py`, fed the service's view: heartbeats, `sf_capacity` records, the
`sf_sessions` hint and the contracts placement knows) and the fleet simulator's arrival policy
(`bench.fleet_arms.reacting`, the policy's `react` on the snapshot the simulator builds) choose the same
host, or both refuse. Hundreds of seeded rounds, under each latency model and with a latency cap."""

from __future__ import annotations

import random

import msgspec
import pytest

from bench.fleet_arms import reacting
from libs.contracts import Demand, Guard, floor_row
from libs.schemas.common import EngineEntry, ProfileRow, SessionSummary
from libs.schemas.placement import HostRecord, Reserved
from services.placement import choice
from services.placement.fleetview import dirty_rate_bps
from services.placement.policy import Fleet, Host, Params, PathRates, Place, Session
from tests.support.fleet_rows import GIB, c1

GB = 1 << 30
PATHS = PathRates(default_bps=2e9, cross_zone_bps=1e9)
BASE = Params(guard=Guard(busy_fraction=0.1, memory_fraction=0.05, max_sessions=6), keep_warm_s=0.0)
PARAMS = {"profile": BASE, "colocation": msgspec.structs.replace(BASE, latency_model="colocation"),
          "capped": msgspec.structs.replace(BASE, latency_cap_ms=68.75)}
SETTLE = 5.0
NOW = 1000.0


def profile(rng: random.Random) -> list[ProfileRow]:
    scale = rng.choice([0.5, 1.0, 1.5])
    return [ProfileRow(backend="world", tier=t, quantum_ms=b * scale / 1.5, block_ms=b * scale,
                       state_bytes=rng.choice([1, 2, 4]) * GB, media_s_per_block=0.1,
                       dirty_bytes_per_block=rng.choice([0, 1 << 20, 64 << 20]))
            for t, b in {4: 10.0, 8: 20.0, 16: 40.0}.items()]


def contract(rng: random.Random):
    return c1(period_ms=rng.choice([50.0, 100.0, 200.0, 400.0]), floor=rng.choice([4, 8, 16]))


def round_(rng: random.Random, n: int):
    """One fleet, as the service sees it and as the simulator presents it, and the session arriving."""
    entries: list[EngineEntry] = []
    records: dict[str, HostRecord] = {}
    sim_hosts: list[Host] = []
    residents: list[Session] = []
    for i in range(n):
        hid = f"h{i}"
        on = [Session(session_id=f"{hid}-s{j}", backend="world", contract=contract(rng), state="serving",
                      host_id=hid) for j in range(rng.randint(0, 3))]
        residents += on
        entry = EngineEntry(host_id=hid, device="cuda:0", machine=f"m{i}", memory_bytes=24 * GIB,
                            free_memory_bytes=rng.choice([24, 12, 6, 2]) * GIB, sessions=len(on),
                            heartbeat_at=NOW, profile=profile(rng), busy_fraction=rng.uniform(0.0, 0.95),
                            threads=rng.choice([0, 1, 2]), session_ids=[s.session_id for s in on])
        if rng.random() < 0.1:
            entry = msgspec.structs.replace(entry, profile=[])  # still profiling
        state = rng.choices(["up", "draining", "drained"], [8, 1, 1])[0]
        held = {f"{hid}-r{j}": Reserved(busy_fraction=rng.uniform(0.0, 0.3), state_bytes=rng.choice([0, GB]),
                                        at=NOW, incarnation="inc") for j in range(rng.choice([0, 0, 1, 2]))}
        if held or state != "up" or rng.random() < 0.5:
            records[hid] = HostRecord(host_id=hid, state=state, sessions=held)
        entries.append(entry)
        sim_hosts.append(Host(entry=entry, state="up" if state == "up" else "draining",
                              reserved=tuple(Demand(busy_fraction=r.busy_fraction, state_bytes=r.state_bytes)
                                             for r in held.values())))
    c = contract(rng)
    rows = [r for e in entries if (r := floor_row(e.profile, "world", c.quality_floor))]
    arriving = Session(session_id="new", backend="world", contract=c, state="queued",
                       threads=rng.choice([0, 0, 1, 2]), last_input_at=NOW,
                       state_bytes=max((r.state_bytes for r in rows), default=0),
                       dirty_rate_bps=max((dirty_rate_bps(c, "world", e) for e in entries), default=0.0))
    # The simulator counts a draining host's residents where they are, and a drained one has none left.
    sim_hosts = [h for h in sim_hosts if (records.get(h.host_id) or HostRecord(host_id="")).state != "drained"]
    kept = {h.host_id for h in sim_hosts}
    sim = Fleet(now=NOW, hosts=tuple(sim_hosts), sessions=(*[s for s in residents if s.host_id in kept], arriving),
                paths=PATHS)
    summaries = {s.session_id: SessionSummary(session_id=s.session_id, owner_server_id=s.host_id, state="serving")
                 for s in residents}
    specs = {s.session_id: (s.contract, s.backend) for s in residents}
    return entries, records, summaries, specs, arriving, sim


@pytest.mark.parametrize("model", sorted(PARAMS))
def test_the_service_and_the_simulator_place_alike(model):
    params, rng = PARAMS[model], random.Random(f"one-policy-{model}")
    simulator = reacting(params)
    outcomes = {"placed": 0, "refused": 0, "pinned": 0}
    for _ in range(300):
        entries, records, summaries, specs, arriving, sim = round_(rng, rng.randint(1, 8))
        decision = simulator(sim)
        expect = next((a.host_id for a in decision.actions if isinstance(a, Place)), None)
        got = choice.choose(choice.wanted("new", arriving.contract, "world", threads=arriving.threads),
                            hosts=entries, records=records, params=params, settle_s=SETTLE, paths=PATHS,
                            residents=choice.residents_of(summaries, specs, entries))
        assert (got.estimate.host_id if got.estimate else None) == expect, (model, entries, records)
        if expect is None:
            assert decision.refusals[0].reason == got.reason
            assert len(got.estimates) == len(entries) and not any(e.fits for e in got.estimates)
        outcomes["placed" if expect else "refused"] += 1
        outcomes["pinned"] += bool(expect and arriving.threads)
    # the rounds exercise both outcomes and the thread preference, not one of them only
    assert min(outcomes.values()) >= 20, outcomes
