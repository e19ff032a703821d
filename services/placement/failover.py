"""Failover decisions: which sessions lost their owner, and where each goes. Pure: no I/O, clock passed in.

A session is stranded when fence's log names an owner process that is dead (assigned or
claimed: an assign to a dead process will never be claimed either). Each stranded session
goes where the fleet policy's placement function puts it (`choice.py`, in its `spread` form: within
its best rank the host holding the fewest sessions, so one death's sessions spread within a sweep and
over successive sweeps alike; every reservation this plan makes counted on the next choice), on any
live, undrained host but the one that died if one takes it, preferring hosts at the session's torch
thread count; if none fits it is orphaned, with every host's reason, until capacity appears. A session
another placer already reserved a live host for keeps that host, so placers that race converge on one choice; the assign's compare-and-set on the
version both saw decides which of them acts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from libs.contracts import Contract, Estimate
from libs.schemas.common import EngineEntry
from libs.schemas.fence import SessionView
from libs.schemas.placement import HostRecord
from services.placement import capacity, choice
from services.placement.liveness import Liveness
from services.placement.policy import Params, PathRates

OwnerState = Literal["closed", "unowned", "alive", "unknown", "dead"]


def owner_state(view: SessionView, liveness: Liveness, now: float) -> OwnerState:
    if view.closed:
        return "closed"
    if view.owner is None:
        return "unowned"  # admission's queue places it
    alive = liveness.owner_alive(view.owner.server_id, view.incarnation, now)
    return "unknown" if alive is None else "alive" if alive else "dead"


@dataclass(frozen=True, slots=True)
class Stranded:
    session_id: str
    view: SessionView
    contract: Contract
    backend: str
    threads: int = 0  # the torch threads its blocks run at (its block journal's count; 0: unknown or any)


@dataclass(frozen=True, slots=True)
class Reassign:
    session_id: str
    host_id: str
    incarnation: str
    expect_version: int  # the version the dead owner holds: the assign's compare-and-set
    estimate: Estimate
    reserved: bool  # a reservation for it on host_id already exists


@dataclass(frozen=True, slots=True)
class Orphan:
    session_id: str
    estimates: list[Estimate]


def plan(stranded: Sequence[Stranded], hosts: Sequence[EngineEntry], records: Mapping[str, HostRecord],
         params: Params, settle_s: float, now: float, *, paths: PathRates) -> list[Reassign | Orphan]:
    """One decision per stranded session, in session_id order, each seeing the reservations before it."""
    records = dict(records)
    by_id = {h.host_id: h for h in hosts}
    out: list[Reassign | Orphan] = []
    for s in sorted(stranded, key=lambda s: s.session_id):
        assert s.view.owner is not None
        dead_host = s.view.owner.server_id
        held = capacity.reserved_on(records, s.session_id)
        host = by_id.get(held) if held else None
        record = records.get(held) if held else None
        if held and host is not None and record is not None and record.state == "up" and held != dead_host \
                and record.sessions[s.session_id].incarnation == host.incarnation:
            est = capacity.fit(s.contract, s.backend, host, capacity.unreserve(record, [s.session_id]), params.guard,
                               settle_s)
            out.append(Reassign(s.session_id, held, host.incarnation, s.view.owner.version, est, reserved=True))
            continue
        want = choice.wanted(s.session_id, s.contract, s.backend, threads=s.threads)
        # Any host but the one that died first (a restarted process under its id restores from scratch too)
        got = choice.choose(want, hosts=hosts, records=records, params=params, settle_s=settle_s, paths=paths,
                            exclude=[dead_host], spread=True)
        if got.estimate is None:
            got = choice.choose(want, hosts=hosts, records=records, params=params, settle_s=settle_s, paths=paths,
                                spread=True)
        best = got.estimate
        if best is None:
            out.append(Orphan(s.session_id, got.estimates))
            continue
        chosen = by_id[best.host_id]
        records[best.host_id] = capacity.reserve(records.get(best.host_id) or HostRecord(host_id=best.host_id),
                                                 s.session_id, best, chosen.incarnation, now)
        out.append(Reassign(s.session_id, best.host_id, chosen.incarnation, s.view.owner.version, best,
                            reserved=False))
    return out
