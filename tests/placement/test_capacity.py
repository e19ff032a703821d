"""Capacity reservations (services/placement/capacity.py): a reservation counts until a heartbeat shows
it, and concurrent placers that only ever write by compare-and-set on a host record's revision never
over-commit a host. Where a session goes is the policy's (tests/placement/test_choice.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given
from hypothesis import strategies as st

from libs.contracts import Demand, Guard
from libs.schemas.placement import HostRecord
from services.placement import capacity
from tests.support.fleet_rows import c1, host

GUARD = Guard(max_sessions=8)
SETTLE = 5.0


def test_reservations_count_until_heartbeats_show_them():
    hosts, records = [host("h0", busy=0.6, at=1000.0)], {}
    for i in range(3):
        est = capacity.fit(c1(), "world", hosts[0], records.get("h0"), GUARD, SETTLE)
        assert est.fits and est.host_busy_fraction == pytest.approx(0.6 + 0.1 * i)
        records["h0"] = capacity.reserve(records.get("h0") or HostRecord(host_id="h0"), f"s{i}", est, "inc", 1000.0)
    assert capacity.fit(c1(), "world", hosts[0], records["h0"], GUARD, SETTLE).reason == "busy"  # 0.9 fills it
    # h0's own heartbeat, taken after the settle time, shows its sessions: no double count.
    settled = host("h0", busy=0.8, at=1000.0 + SETTLE)
    assert capacity.pending(records["h0"], settled, SETTLE) == []
    assert capacity.fit(c1(), "world", settled, records["h0"], GUARD, SETTLE).fits


def test_a_reservation_holds_until_the_heartbeat_lists_the_session_not_until_a_time():
    """The over-admission issue 23 measured: heartbeats newer than the placement that do not show the
    session yet (it is still being assigned and built) must not free its room."""
    import msgspec

    est = capacity.fit(c1(period_ms=20.0), "world", host("h0", at=1000.0), None, GUARD, 30.0)
    record = capacity.reserve(HostRecord(host_id="h0"), "s0", est, "inc", 1000.0)  # 0.5 of the device
    later = host("h0", at=1010.0)  # ten seconds on, the session not listed: the load does not count it
    assert capacity.pending(record, later, 30.0) == [Demand(busy_fraction=0.5, state_bytes=est.state_bytes)]
    assert capacity.fit(c1(period_ms=20.0), "world", later, record, GUARD, 30.0).reason == "busy"
    shown = msgspec.structs.replace(host("h0", busy=0.5, at=1001.0), session_ids=["s0"])
    assert capacity.pending(record, shown, 30.0) == []


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
