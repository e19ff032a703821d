"""Capacity reservations (services/placement/capacity.py): least busy first, and concurrent placers that
only ever write by compare-and-set on a host record's revision never over-commit a host."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given
from hypothesis import strategies as st

from libs.contracts import Demand, Guard
from libs.schemas.placement import HostRecord
from services.placement import capacity
from tests.admission.fleet import GIB, c1, host, rows

GUARD = Guard(max_sessions=8)
SETTLE = 5.0


def first(ests):
    return next((e for e in ests if e.fits), None)


def test_least_busy_first_lists_every_reason():
    hosts = [host("h2"), host("h0", busy=0.85), host("h1", busy=0.3)]
    ests = capacity.by_room(c1(), "world", hosts, {}, GUARD, SETTLE)
    assert [(e.host_id, e.reason) for e in ests] == [("h2", ""), ("h1", ""), ("h0", "busy")]
    assert first(ests).host_id == "h2" and first(ests).busy_fraction == pytest.approx(0.1)


def test_reservations_spread_sessions_and_settle_once_heartbeats_show_them():
    hosts, records = [host("h0", busy=0.6, at=1000.0), host("h1", busy=0.3, at=1000.0)], {}
    chosen = []
    for i in range(7):
        est = first(capacity.by_room(c1(), "world", hosts, records, GUARD, SETTLE))
        records[est.host_id] = capacity.reserve(records.get(est.host_id) or HostRecord(host_id=est.host_id),
                                                f"s{i}", est, "inc", 1000.0)
        chosen.append(est.host_id)
    # h1 fills to h0's load, then they alternate (ties: fewer sessions); 0.9 fills each
    assert chosen == ["h1", "h1", "h1", "h0", "h1", "h0", "h1"]
    # h0's own heartbeat, taken after the settle time, shows its sessions: no double count.
    settled = host("h0", busy=0.8, at=1000.0 + SETTLE)
    assert capacity.pending(records["h0"], settled, SETTLE) == []
    assert capacity.fit(c1(), "world", settled, records["h0"], GUARD, SETTLE).fits


def test_a_reservation_holds_until_the_heartbeat_lists_the_session_not_until_a_time():
    """The over-admission issue 23 measured: heartbeats newer than the placement that do not show the
    session yet (it is still being assigned and built) must not free its room."""
    import msgspec

    est = first(capacity.by_room(c1(period_ms=20.0), "world", [host("h0", at=1000.0)], {}, GUARD, 30.0))
    record = capacity.reserve(HostRecord(host_id="h0"), "s0", est, "inc", 1000.0)  # 0.5 of the device
    later = host("h0", at=1010.0)  # ten seconds on, the session not listed: the load does not count it
    assert capacity.pending(record, later, 30.0) == [Demand(busy_fraction=0.5, state_bytes=est.state_bytes)]
    assert capacity.fit(c1(period_ms=20.0), "world", later, record, GUARD, 30.0).reason == "busy"
    shown = msgspec.structs.replace(host("h0", busy=0.5, at=1001.0), session_ids=["s0"])
    assert capacity.pending(record, shown, 30.0) == []


def test_sessions_spread_over_devices_but_not_over_the_hosts_of_one_device():
    """h0 and h1 share machine m's CPU (h1 already serves 2 sessions), h2 is alone on machine n. New
    sessions alternate between the two devices by load; on m they all go to h1, whose scheduler then
    sees every deadline on that CPU. Neither a share h0 measured 3 % cheaper nor the pooled sums'
    last bits may send them to h0."""
    import msgspec

    def at(h, machine):
        return msgspec.structs.replace(h, machine=machine, device="cpu")

    cheaper = rows(tiers={4: 9.7, 8: 19.4, 16: 38.8})
    hosts = [at(host("h0", busy=0.1, at=1000.0, profile=cheaper), "m"),
             at(host("h1", busy=0.1, sessions=2, at=1000.0), "m"), at(host("h2", busy=0.2, at=1000.0), "n")]
    records, chosen = {}, []
    for i in range(6):
        est = first(capacity.by_room(c1(), "world", hosts, records, GUARD, SETTLE))
        records[est.host_id] = capacity.reserve(records.get(est.host_id) or HostRecord(host_id=est.host_id),
                                                f"s{i}", est, "inc", 1000.0)
        chosen.append(est.host_id)
    assert chosen.count("h0") == 0 and chosen.count("h1") == 3 and chosen.count("h2") == 3


def test_a_draining_host_takes_nothing_and_most_room_spreads():
    hosts = [host("h0"), host("h1", busy=0.5), host("h2", busy=0.2)]
    records = {"h0": HostRecord(host_id="h0", state="draining")}
    best, ests = capacity.most_room(c1(), "world", hosts, records, GUARD, SETTLE)
    assert best.host_id == "h2" and ests[-1].reason == "draining"
    best, _ = capacity.most_room(c1(), "world", hosts, records, GUARD, SETTLE, exclude=["h2"])
    assert best.host_id == "h1"


def test_no_fit_names_each_host_reason():
    hosts = [host("h0", busy=0.85), host("h1", free=3 * GIB), host("h2", profile=rows(backend="avatar"))]
    ests = capacity.by_room(c1(), "world", hosts, {}, GUARD, SETTLE)
    assert [e.reason for e in ests] == ["busy", "memory", "no_profile"]


def test_a_death_releases_only_the_dead_process_reservations():
    est = capacity.fit(c1(), "world", host("h0"), None, GUARD, SETTLE)
    record = HostRecord(host_id="h0", incarnation="old")
    record = capacity.reserve(record, "a", est, "old", 1.0)
    record = capacity.reserve(record, "b", est, "new", 2.0)
    after = capacity.after_death(record, "old", "new")
    assert set(after.sessions) == {"b"} and after.incarnation == "new"
    assert capacity.reserved_on({"h0": after}, "b") == "h0" and capacity.reserved_on({"h0": after}, "a") is None


# ---------------------------------------------------------------- concurrent placers over a CAS store


@dataclass
class Store:
    """A KV bucket's semantics for one key: a write lands only if the revision it read is still current."""

    record: HostRecord = field(default_factory=lambda: HostRecord(host_id="h0"))
    revision: int = 1

    def cas(self, record: HostRecord, read_revision: int) -> bool:
        if read_revision != self.revision:
            return False
        self.record, self.revision = record, self.revision + 1
        return True


@given(periods=st.lists(st.sampled_from([50.0, 100.0, 200.0, 400.0]), min_size=2, max_size=16),
       steps=st.lists(st.integers(0, 63), max_size=120), busy=st.floats(0.0, 0.8))
def test_concurrent_placers_never_over_commit(periods, steps, busy):
    """Placers read, decide and CAS in any interleaving: whatever lands keeps the host within its guard."""
    h = host("h0", busy=busy, at=1000.0)
    store = Store()
    todo = [(f"s{i}", c1(period_ms=p)) for i, p in enumerate(periods)]
    reads: dict[str, tuple[HostRecord, int]] = {}
    placed: dict[str, float] = {}  # what each placer believes it reserved (and would assign there)
    script = iter(steps)
    while todo:
        step = next(script, 0)  # once the script ends, the first placer reads and acts until done
        sid, contract = todo[step % len(todo)]
        if sid not in reads or step & 32:  # (re)read now, or act on the older read it holds
            reads[sid] = (store.record, store.revision)
            continue
        record, revision = reads.pop(sid)
        est = capacity.fit(contract, "world", h, record, GUARD, SETTLE)
        if not est.fits:
            todo.remove((sid, contract))
        elif store.cas(capacity.reserve(record, sid, est, "inc", 1000.0), revision):
            placed[sid] = est.busy_fraction
            todo.remove((sid, contract))
    assert busy + sum(placed.values()) <= 1.0 - GUARD.busy_fraction + 1e-9
    assert len(placed) <= GUARD.max_sessions
    assert set(placed) == set(store.record.sessions)  # no reservation lost to a concurrent write
    if any(capacity.fit(c, "world", h, None, GUARD, SETTLE).fits for _, c in todo_all(periods)):
        assert store.record.sessions  # and a session that fits an empty record is never refused for nothing


def todo_all(periods):
    return [(f"s{i}", c1(period_ms=p)) for i, p in enumerate(periods)]


def test_hosts_on_one_device_split_it_in_placement_and_most_room():
    """h0 and h1 share machine m's CPU (0.4 + 0.3 busy, and a 0.1 reservation on h1 its heartbeat does not
    show yet): a 0.2 session fits neither; h2 on another machine takes it."""
    import msgspec

    from libs.schemas.placement import Reserved

    def at(h, machine):
        return msgspec.structs.replace(h, machine=machine, device="cpu")

    hosts = [at(host("h0", busy=0.4), "m"), at(host("h1", busy=0.3), "m"), at(host("h2", busy=0.5), "n")]
    records = {"h1": HostRecord(host_id="h1", sessions={"x": Reserved(busy_fraction=0.1, state_bytes=0, at=1000.0)})}
    ests = capacity.by_room(c1(floor=8), "world", hosts, records, GUARD, SETTLE)
    assert [(e.host_id, e.reason) for e in ests] == [("h2", ""), ("h0", "busy"), ("h1", "busy")]
    best, _ = capacity.most_room(c1(floor=8), "world", hosts, records, GUARD, SETTLE)
    assert best is not None and best.host_id == "h2"
