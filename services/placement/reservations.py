"""The one writer of `sf_capacity`: reservations and host lifecycle states, every write a compare-and-set.

A reservation is judged again on the record as read just before its write (`capacity.fit` on the
host's measured load plus its unsettled reservations, pooled with the hosts sharing its device), so
a placer whose view went stale decides on the newer record (`records.py`, `device_cas.py`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import msgspec

from libs.contracts import Contract, Guard
from libs.errors import Rejected
from libs.schemas.common import EngineEntry
from libs.schemas.placement import HostRecord, HostState
from services.placement import capacity, device_cas
from services.placement.parts import FleetReader, SpecSource
from services.placement.records import Records


class Reservations:
    def __init__(self, *, records: Records, view: FleetReader, specs: SpecSource, guard: Guard,
                 settle_s: float) -> None:
        self.records, self.view, self.specs = records, view, specs
        self.guard, self.settle_s = guard, settle_s

    async def reserve(self, session_id: str, host_id: str, incarnation: str) -> HostRecord:
        """Reserve the session's demand on the host by CAS, in the guard band failover and drain keep;
        `Rejected` if the fresh record has no room."""
        contract, backend = await self.specs.spec(session_id)
        return await self.reserve_for(session_id, host_id, contract, backend, self.guard, incarnation)

    async def reserve_for(self, session_id: str, host_id: str, contract: Contract, backend: str, guard: Guard,
                          incarnation: str) -> HostRecord:
        host = self.view.entry(host_id)
        if host is None:
            raise Rejected(f"host {host_id} is not live", reason="no_fit", host_id=host_id)

        def take(view: EngineEntry, record: HostRecord) -> HostRecord:
            # Decided again on the records as read now (the host's, and its device peers'): the CAS makes
            # this the decision that holds.
            est = capacity.fit(contract, backend, view, capacity.unreserve(record, [session_id]), guard,
                               self.settle_s)
            if not est.fits:
                raise Rejected(f"host {host_id}: {est.reason}", reason="no_fit", host_id=host_id)
            return capacity.reserve(record, session_id, est, incarnation, time.time())

        return await device_cas.reserve(self.records, host, self.view.live_hosts(), self.settle_s, session_id, take)

    async def unreserve(self, host_id: str, session_ids: list[str]) -> None:
        await self.records.change(host_id, lambda r: capacity.unreserve(r, session_ids))

    async def after_death(self, host_id: str, incarnation: str, successor: str) -> None:
        await self.records.change(host_id, lambda r: capacity.after_death(r, incarnation, successor))

    async def set_state(self, host_id: str, state: HostState, *, only_from: HostState | None = None) -> HostRecord:
        """The host's lifecycle state; with `only_from`, only a host in that state changes (an undrain
        that landed meanwhile wins over a drain finishing)."""
        return await self.records.change(host_id, _to_state(state, only_from))

    async def given_out(self, host_id: str) -> None:
        """A host id the provisioner gives out again must take sessions: whatever a former drain left on
        its record goes."""
        await self.records.change(host_id, lambda r: msgspec.structs.replace(r, state="up", sessions={}))

    async def read(self, host_id: str) -> tuple[HostRecord, int]:
        return await self.records.read(host_id)

    async def fence_drained(self, record: HostRecord, revision: int) -> bool:
        """`record` (read at `revision`) goes to `drained` only if nothing changed it since: whether it did."""
        return await self.records.swap(record.host_id, msgspec.structs.replace(record, state="drained"), revision)


def _to_state(state: HostState, only_from: HostState | None) -> Callable[[HostRecord], HostRecord]:
    def fn(r: HostRecord) -> HostRecord:
        if only_from is not None and r.state != only_from:
            return r
        return msgspec.structs.replace(r, state=state)
    return fn
