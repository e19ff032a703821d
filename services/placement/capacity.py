"""Host capacity as placement reserves it: the one capacity model of `libs.contracts`, over durable records.

Each engine host has a `HostRecord` in the `sf_capacity` KV bucket holding its lifecycle
state and one `Reserved` entry per session placed there. A reservation counts against
the host (on top of its measured load) until the host's heartbeat lists the session (or, one that
never arrives, until a heartbeat `settle_s` newer), exactly as `contracts.Reservations` counts placements; what makes it hold
under concurrency is that a record only changes by compare-and-set on its KV revision,
so a placer whose read went stale decides again on the newer record.

Pure: no I/O, the clock passed in.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import msgspec

from libs.contracts import Contract, Demand, Estimate, Guard, estimate, pooled, unsettled
from libs.schemas.common import EngineEntry
from libs.schemas.placement import HostRecord, Reserved


def pending(record: HostRecord | None, host: EngineEntry, settle_s: float) -> list[Demand]:
    """The reservations on `host` that its heartbeat cannot show yet."""
    if record is None:
        return []
    return [Demand(busy_fraction=r.busy_fraction, state_bytes=r.state_bytes)
            for sid, r in record.sessions.items() if unsettled(sid, r.at, host, settle_s)]


def fit(contract: Contract, backend: str, host: EngineEntry, record: HostRecord | None, guard: Guard,
        settle_s: float) -> Estimate:
    """Does the session fit `host` now: measured load plus unsettled reservations, and the host takes work."""
    if record is not None and record.state != "up":
        return Estimate(host_id=host.host_id, fits=False, reason=record.state)
    return estimate(contract, backend, host, pending(record, host, settle_s), guard)


def shared(hosts: Sequence[EngineEntry], records: Mapping[str, HostRecord], settle_s: float) -> dict[str, EngineEntry]:
    """Hosts that share a device split it (`contracts.pooled`), their reservations included."""
    return pooled(hosts, lambda h: pending(records.get(h.host_id), h, settle_s))


def reserve(record: HostRecord, session_id: str, est: Estimate, incarnation: str, now: float) -> HostRecord:
    """`record` with the session's demand reserved on it (replacing an older reservation of the session)."""
    entry = Reserved(busy_fraction=est.busy_fraction, state_bytes=est.state_bytes, at=now, incarnation=incarnation)
    return msgspec.structs.replace(record, sessions={**record.sessions, session_id: entry})


def unreserve(record: HostRecord, session_ids: Iterable[str]) -> HostRecord:
    gone = set(session_ids)
    return msgspec.structs.replace(record, sessions={s: r for s, r in record.sessions.items() if s not in gone})


def after_death(record: HostRecord, dead_incarnation: str, new_incarnation: str = "") -> HostRecord:
    """A host process died: the reservations made on it go (its sessions are failed over); ones already
    made on its successor stay."""
    keep = {s: r for s, r in record.sessions.items() if r.incarnation not in ("", dead_incarnation)}
    return msgspec.structs.replace(record, sessions=keep, incarnation=new_incarnation or record.incarnation)


def reserved_on(records: Mapping[str, HostRecord], session_id: str) -> str | None:
    """The host holding the newest reservation for the session, if any."""
    held = [(r.sessions[session_id].at, h) for h, r in records.items() if session_id in r.sessions]
    return max(held)[1] if held else None
