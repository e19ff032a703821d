"""Where a session goes, chosen by the fleet policy's own placement function. Pure: no I/O.

The placement service places new sessions (`placer.py`), failed-over sessions (`failover.py`) and a
draining host's sessions (`drain.py`) with `policy.placement.Placer.choose`, the function the fleet
simulator runs (`policy.decide.react`), so what the simulator measures is what the service does.
This module only translates: it builds the policy's snapshot (`policy.Fleet`) from the service's
fleet view (live heartbeats, `sf_capacity` records and the sessions placement knows the contracts of)
and reads the chosen host back as an `Estimate`.

What it adds to the snapshot is what only the service knows: each host's unsettled reservations are
its pending demand, hosts sharing a device see its pooled load (`contracts.device_view`), and a
host whose record is not `up` takes nothing. A host alone on its device is passed as its heartbeat
shows it, exactly as the simulator passes its hosts (tests/placement/test_one_policy.py). The verdict is still only a hint: the reservation's compare-and-set
on the host's record (`reservations.py`, device-wide in `device_cas.py`) decides, and a refusal names
every host's reason.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import msgspec

from libs.contracts import Contract, Estimate, device_key, device_view, floor_row
from libs.schemas.common import EngineEntry, SessionSummary
from libs.schemas.placement import HostRecord
from services.placement import capacity
from services.placement.fleetview import dirty_rate_bps
from services.placement.policy import Fleet, Host, Params, PathRates, Session
from services.placement.policy.placement import Placer
from services.placement.policy.plan import Plan


@dataclass(frozen=True, slots=True)
class Choice:
    estimate: Estimate | None  # the chosen host's verdict (it fits), or None: the session fits nowhere now
    reason: str = ""  # the policy's refusal ("no_fit", "past_cap") when `estimate` is None
    estimates: list[Estimate] = field(default_factory=list)  # on a refusal: every host's verdict, by host_id


def wanted(session_id: str, contract: Contract, backend: str, *, threads: int = 0, state_bytes: int = 0) -> Session:
    """The session to place, as the policy reads a queued one."""
    return Session(session_id=session_id, backend=backend, contract=contract, state="queued",
                   threads=threads, state_bytes=state_bytes)


def snapshot(*, hosts: Sequence[EngineEntry], records: Mapping[str, HostRecord], settle_s: float, paths: PathRates,
             residents: Sequence[Session] = (), exclude: Iterable[str] = ()) -> Fleet:
    """The policy's fleet: every live host not excluded, as capacity sees it, and its known residents."""
    skip = set(exclude)
    pending = {h.host_id: capacity.pending(records.get(h.host_id), h, settle_s) for h in hosts}
    groups: dict[str, list[EngineEntry]] = {}
    for h in sorted(hosts, key=lambda h: h.host_id):
        groups.setdefault(device_key(h), []).append(h)
    views: dict[str, Host] = {}
    for peers in groups.values():
        for h in peers:
            record = records.get(h.host_id)
            state = record.state if record is not None else "up"
            if len(peers) == 1:  # alone on its device: the heartbeat as it is, its reservations pending
                views[h.host_id] = Host(entry=h, state=state, reserved=tuple(pending[h.host_id]))
            else:
                # the whole device's load and sessions with its own reservations folded in, so which process
                # of a device takes a session is the policy's tie rule (best fit: the one holding more)
                views[h.host_id] = Host(entry=device_view(h, peers, pending, fold_own=True), state=state)
    out = tuple(views[h.host_id] for h in sorted(hosts, key=lambda h: h.host_id) if h.host_id not in skip)
    kept = {h.host_id for h in out}
    # `now` only dates idleness and moves, which placement does not read
    return Fleet(now=0.0, hosts=out, sessions=tuple(s for s in residents if s.host_id in kept), paths=paths)


def choose(session: Session, *, hosts: Sequence[EngineEntry], records: Mapping[str, HostRecord], params: Params,
           settle_s: float, paths: PathRates, residents: Sequence[Session] = (), exclude: Iterable[str] = (),
           spread: bool = False) -> Choice:
    """The policy's host for `session` (queued: `wanted`) on the fleet as the service sees it."""
    skip = set(exclude)
    fleet = snapshot(hosts=hosts, records=records, settle_s=settle_s, paths=paths, residents=residents, exclude=skip)
    session = _sized(session, fleet)
    got = Placer(Plan(fleet, params), spread=spread).choose(session)
    if not isinstance(got, str):
        return Choice(estimate=got[1])
    shared = capacity.shared(hosts, records, settle_s)
    ests = [capacity.fit(session.contract, session.backend, shared[h.host_id], records.get(h.host_id), params.guard,
                         settle_s) for h in fleet.hosts]
    # a host capacity would take but the policy would not (past the latency cap) says why not
    return Choice(estimate=None, reason=got, estimates=[e if not e.fits else _refused(e, got) for e in ests])


def _refused(e: Estimate, reason: str) -> Estimate:
    return msgspec.structs.replace(e, fits=False, reason=reason)


def _sized(s: Session, fleet: Fleet) -> Session:
    """A session placement has not seen run yet, sized as its floor rows say (the most any host's row
    says): what a live move of it off the host would carry, which the policy's way-out rank reads."""
    if s.state_bytes or s.dirty_rate_bps:
        return s
    rows = [r for h in fleet.hosts if (r := floor_row(h.entry.profile, s.backend, s.contract.quality_floor))]
    if not rows:
        return s
    return msgspec.structs.replace(s, state_bytes=max(r.state_bytes for r in rows), dirty_rate_bps=max(
        dirty_rate_bps(s.contract, s.backend, h.entry) for h in fleet.hosts))


def residents_of(summaries: Mapping[str, SessionSummary], spec: Mapping[str, tuple[Contract, str]],
                 hosts: Sequence[EngineEntry]) -> list[Session]:
    """The sessions the `sf_sessions` hint shows serving (or assigned, about to) on live hosts whose contract
    placement knows: the residents whose latency targets the policy keeps (one it cannot see still counts
    in its host's measured load; a suspended one takes no device time)."""
    live = {h.host_id for h in hosts}
    out = []
    for sid, s in sorted(summaries.items()):
        known = spec.get(sid)
        if known is None or s.state not in ("serving", "assigned") or s.owner_server_id not in live:
            continue
        out.append(Session(session_id=sid, backend=known[1], contract=known[0], state="serving",
                           host_id=s.owner_server_id))
    return out
