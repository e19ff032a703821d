"""Two placers reserving at once on two hosts of one device (issue 22: a mutation campaign dropped the
device-wide compare-and-set and no test noticed, because its placers both picked the lead host first).

The placers here pick the two hosts that are not the device's lead, and both read before either writes
(a barrier in the store), so each judges the device without the other's reservation. The device has
room for one of the two sessions: exactly one reservation may stand. Seen failing with
`device_cas.reserve` reduced to the per-host compare-and-set.
"""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from libs.contracts import Guard
from libs.errors import Rejected
from libs.schemas.common import EngineEntry
from libs.schemas.placement import HostRecord
from services.placement import capacity, device_cas
from tests.support.fleet_rows import c1, host

GUARD = Guard(busy_fraction=0.1, memory_fraction=0.05, max_sessions=16)
SETTLE = 6.0


class Store:
    """`Records` in memory: a write lands only at the revision read. Every placer's first write waits
    until both placers have read, so the two decisions are made on the same device state."""

    def __init__(self, placers: int) -> None:
        self.records: dict[str, tuple[HostRecord, int]] = {}
        self.both_read = asyncio.Barrier(placers)
        self.waited: set[str] = set()

    async def read(self, host_id: str) -> tuple[HostRecord, int]:
        return self.records.get(host_id, (HostRecord(host_id=host_id), 0))

    async def swap(self, host_id: str, record: HostRecord, revision: int) -> bool:
        task = asyncio.current_task()
        name = task.get_name() if task else ""
        if name not in self.waited:
            self.waited.add(name)
            await self.both_read.wait()
        if self.records.get(host_id, (None, 0))[1] != revision:
            return False
        self.records[host_id] = (record, revision + 1)
        return True

    async def change(self, host_id, fn):
        for _ in range(32):
            record, revision = await self.read(host_id)
            new = fn(record)
            if new == record and revision:
                return record
            if await self.swap(host_id, new, revision):
                return new
        raise AssertionError("kept changing")


def on_one_device(h: EngineEntry) -> EngineEntry:
    return msgspec.structs.replace(h, machine="m", device="cuda:0")


async def test_two_placers_on_two_hosts_of_one_device_never_both_land():
    hosts = [on_one_device(host(h, busy=0.1, at=1e12)) for h in ("h0", "h1", "h2")]  # h0 leads the device
    contract = c1(period_ms=100.0, floor=16)
    device = capacity.shared(hosts, {}, SETTLE)["h1"]  # every host carries the whole device's load
    one = capacity.fit(contract, "world", device, None, GUARD, SETTLE)
    assert one.fits and device.busy_fraction + 2 * one.busy_fraction > 1.0 - GUARD.busy_fraction  # one, not two
    store = Store(placers=2)

    async def place(sid: str, target: EngineEntry) -> bool:
        def take(view: EngineEntry, record: HostRecord) -> HostRecord:
            est = capacity.fit(contract, "world", view, capacity.unreserve(record, [sid]), GUARD, SETTLE)
            if not est.fits:
                raise Rejected(f"{target.host_id}: {est.reason}", reason="no_fit")
            return capacity.reserve(record, sid, est, target.incarnation, 1e12)
        try:
            await device_cas.reserve(store, target, hosts, SETTLE, sid, take)  # type: ignore[arg-type]
        except Rejected:
            return False
        return True

    landed = await asyncio.gather(asyncio.create_task(place("a", hosts[1]), name="a"),
                                  asyncio.create_task(place("b", hosts[2]), name="b"))
    assert sorted(landed) == [False, True]
    standing = {sid for record, _ in store.records.values() for sid in record.sessions}
    assert len(standing) == 1


@pytest.mark.parametrize("lead_first", [True, False])
async def test_a_placer_on_the_lead_and_one_on_a_peer_never_both_land(lead_first):
    hosts = [on_one_device(host(h, busy=0.1, at=1e12)) for h in ("h0", "h1")]
    contract = c1(period_ms=100.0, floor=16)
    store = Store(placers=2)

    async def place(sid: str, target: EngineEntry) -> bool:
        def take(view: EngineEntry, record: HostRecord) -> HostRecord:
            est = capacity.fit(contract, "world", view, capacity.unreserve(record, [sid]), GUARD, SETTLE)
            if not est.fits:
                raise Rejected("no room", reason="no_fit")
            return capacity.reserve(record, sid, est, target.incarnation, 1e12)
        try:
            await device_cas.reserve(store, target, hosts, SETTLE, sid, take)  # type: ignore[arg-type]
        except Rejected:
            return False
        return True

    order = hosts if lead_first else hosts[::-1]
    landed = await asyncio.gather(asyncio.create_task(place("a", order[0]), name="a"),
                                  asyncio.create_task(place("b", order[1]), name="b"))
    assert sorted(landed) == [False, True]
    assert len({sid for record, _ in store.records.values() for sid in record.sessions}) == 1
