"""Reserving on a host that shares its device: the per-host compare-and-set made to hold for the device.

A host's record changes only by CAS on its own revision, which keeps two placers out of one host's
gap but not out of one device's: two placers reserving at once on two hosts that share a device
(`contracts.device_key`) each judge the device without the other's reservation, and both land. So a
reservation on such a host also rewrites the device's lead record (its lowest host_id) at the
revision read before judging. Of two placers that judged the same device state, the second write
of one fails: it takes its reservation back and judges again, now seeing the other's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import msgspec

from libs.bus import MAX_CAS_ATTEMPTS
from libs.contracts import device_key
from libs.errors import Conflict
from libs.schemas.common import EngineEntry
from libs.schemas.placement import HostRecord, Reserved
from services.placement import capacity
from services.placement.records import Records

# (the host as capacity must see it, pooled with its device peers; its record as read now) → the record
# with the session reserved, or raise to write nothing
Take = Callable[[EngineEntry, HostRecord], HostRecord]


async def reserve(records: Records, host: EngineEntry, live: Sequence[EngineEntry], settle_s: float,
                  session_id: str, take: Take) -> HostRecord:
    peers = [h for h in live if h.host_id != host.host_id and device_key(h) == device_key(host)]
    if not peers:
        return await records.change(host.host_id, lambda r: take(host, r))
    group = [host, *peers]
    lead = min(h.host_id for h in group)
    for _ in range(MAX_CAS_ATTEMPTS):
        lead_record, lead_revision = await records.read(lead)
        fresh = {lead: lead_record}
        for h in group:
            if h.host_id != lead:
                fresh[h.host_id] = (await records.read(h.host_id))[0]
        view = capacity.shared(group, fresh, settle_s)[host.host_id]
        if host.host_id == lead:  # one write does both
            new = take(view, lead_record)
            if await records.swap(lead, new, lead_revision):
                return new
            continue
        before = fresh[host.host_id].sessions.get(session_id)
        new = await records.change(host.host_id, _taking(take, view))
        if await records.swap(lead, lead_record, lead_revision):
            return new
        await records.change(host.host_id, _restoring(session_id, before))
    raise Conflict(f"device of {host.host_id} kept changing", host_id=host.host_id)


def _taking(take: Take, view: EngineEntry) -> Callable[[HostRecord], HostRecord]:
    return lambda record: take(view, record)


def _restoring(session_id: str, before: Reserved | None) -> Callable[[HostRecord], HostRecord]:
    def restore(record: HostRecord) -> HostRecord:
        if before is not None:
            return msgspec.structs.replace(record, sessions={**record.sessions, session_id: before})
        return capacity.unreserve(record, [session_id])
    return restore
