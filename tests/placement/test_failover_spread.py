"""Failover placement (pure): a dead host's sessions are spread over the survivors they fit, by the
fleet policy's placement function (`spread`), and what fits nowhere is orphaned with every host's reason."""

from __future__ import annotations

from collections import Counter

import msgspec

from libs.contracts import Contract, Guard
from libs.schemas.common import EngineEntry, ProfileRow
from libs.schemas.fence import Owner, SessionView
from libs.schemas.placement import HostRecord
from services.placement import capacity
from services.placement.failover import Orphan, Reassign, Stranded, plan
from services.placement.policy import Params, PathRates

C1 = Contract(session_class="C1", quality_floor=1, determinism="T0", period_ms=200.0)
NOW = 100.0
PARAMS = Params(guard=Guard())
PATHS = PathRates(default_bps=1e9)


def host(host_id: str, quantum_ms: float, machine: str = "m1") -> EngineEntry:
    """A live CPU host of one machine (hosts of a machine share its device), serving nothing yet."""
    row = ProfileRow(backend="avatar", tier=1, quantum_ms=quantum_ms, block_ms=quantum_ms, state_bytes=1 << 20,
                     media_s_per_block=0.4)
    return EngineEntry(host_id=host_id, device="cpu", memory_bytes=1 << 34, free_memory_bytes=1 << 34,
                       incarnation=f"{host_id}-2", heartbeat_s=0.5, heartbeat_at=NOW, machine=machine,
                       profile=[row])


def stranded(n: int) -> list[Stranded]:
    view = SessionView(owner=Owner(server_id="e0", version=3), claim=Owner(server_id="e0", version=3),
                       incarnation="e0-1")
    return [Stranded(f"s{i}", view, C1, "avatar") for i in range(n)]


def test_a_dead_hosts_sessions_spread_over_every_survivor_they_fit():
    survivors = [host(h, quantum_ms=10.0) for h in ("e1", "e2", "e3")]  # 0.05 of the device each: all fit
    decisions = plan(stranded(7), survivors, {}, PARAMS, settle_s=5.0, now=NOW, paths=PATHS)
    assert all(isinstance(d, Reassign) for d in decisions)
    per_host = Counter(d.host_id for d in decisions)
    assert sorted(per_host.values()) == [2, 2, 3], per_host  # not seven onto the one packed first


def test_what_the_survivors_cannot_hold_is_orphaned_with_a_reason():
    # 0.3 of the device per session, budget 0.9 of a device: each machine's device takes three
    survivors = [host("e1", 60.0, "m1"), host("e2", 60.0, "m1"), host("e3", 60.0, "m2")]
    decisions = plan(stranded(8), survivors, {}, PARAMS, settle_s=5.0, now=NOW, paths=PATHS)
    placed = [d for d in decisions if isinstance(d, Reassign)]
    orphans = [d for d in decisions if isinstance(d, Orphan)]
    assert len(placed) == 6 and len(orphans) == 2
    per_host = Counter(d.host_id for d in placed)
    assert per_host["e3"] == 3 and per_host["e1"] + per_host["e2"] == 3  # capacity is the device's
    assert min(per_host["e1"], per_host["e2"]) >= 1  # spread over its processes too
    for o in orphans:
        assert o.estimates and all(not e.fits and e.reason for e in o.estimates)


def test_a_failover_over_several_sweeps_spreads_too():
    """A dead host's sessions found one sweep at a time (hint lag, a slow read) are still spread: each
    sweep sees the earlier sweeps' arrivals, reserved and not yet in a heartbeat, or settled and in it."""
    survivors = [host(h, quantum_ms=10.0) for h in ("e1", "e2", "e3")]
    records: dict = {}
    per_host: Counter[str] = Counter()
    for s in stranded(6):  # six sweeps, one session each; reservations carried over as the sweeper writes them
        (d,) = plan([s], survivors, records, PARAMS, settle_s=5.0, now=NOW, paths=PATHS)
        assert isinstance(d, Reassign)
        records[d.host_id] = capacity.reserve(records.get(d.host_id) or HostRecord(host_id=d.host_id),
                                              d.session_id, d.estimate, d.incarnation, NOW)
        per_host[d.host_id] += 1
    assert sorted(per_host.values()) == [2, 2, 2], per_host


def test_sweeps_after_the_heartbeats_show_the_arrivals_spread_too():
    """The same once the survivors' heartbeats show what each took (the reservations settled)."""
    survivors = {h: host(h, quantum_ms=10.0) for h in ("e1", "e2", "e3")}
    per_host: Counter[str] = Counter()
    for s in stranded(6):
        (d,) = plan([s], list(survivors.values()), {}, PARAMS, settle_s=5.0, now=NOW, paths=PATHS)
        assert isinstance(d, Reassign)
        h = survivors[d.host_id]
        survivors[d.host_id] = msgspec.structs.replace(h, sessions=h.sessions + 1,
                                                       busy_fraction=h.busy_fraction + d.estimate.busy_fraction)
        per_host[d.host_id] += 1
    assert sorted(per_host.values()) == [2, 2, 2], per_host
