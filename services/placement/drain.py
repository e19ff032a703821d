"""Drain decisions: where each of a host's sessions goes, and in which rounds. Pure: no I/O, clock passed in.

Every session goes to the live, undrained host (not the one draining) with the most room
left after it, each decision seeing the reservations before it. Moves run in rounds in
which no receiver takes two sessions, so the mover's incast rule never rejects one of
ours and no receiver's link is shared within a round.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from libs.contracts import Estimate, Guard
from libs.schemas.common import EngineEntry
from libs.schemas.placement import HostRecord
from services.placement import capacity
from services.placement.failover import Stranded


@dataclass(frozen=True, slots=True)
class Departure:
    """Where one of a draining host's sessions goes: by a live move, or a hand-over if the move is refused."""

    session_id: str
    dest: str
    incarnation: str
    version: int  # the draining host's version of the session: hand-overs compare-and-set on it
    estimate: Estimate


def plan_moves(source: str, sessions: Sequence[Stranded], hosts: Sequence[EngineEntry],
               records: Mapping[str, HostRecord], guard: Guard, settle_s: float,
               now: float) -> tuple[list[Departure], list[tuple[str, list[Estimate]]]]:
    """(moves, sessions no other host has room for with every host's estimate)."""
    records = dict(records)
    by_id = {h.host_id: h for h in hosts}
    moves: list[Departure] = []
    no_room: list[tuple[str, list[Estimate]]] = []
    for s in sorted(sessions, key=lambda s: s.session_id):
        assert s.view.owner is not None
        best, ests = capacity.most_room(s.contract, s.backend, hosts, records, guard, settle_s, exclude=[source])
        if best is None:
            no_room.append((s.session_id, ests))
            continue
        inc = by_id[best.host_id].incarnation
        records[best.host_id] = capacity.reserve(records.get(best.host_id) or HostRecord(host_id=best.host_id),
                                                 s.session_id, best, inc, now)
        moves.append(Departure(s.session_id, best.host_id, inc, s.view.owner.version, best))
    return moves, no_room


def rounds(moves: Sequence[Departure]) -> list[list[Departure]]:
    """The moves in order, cut into rounds in which every receiver appears at most once."""
    out: list[list[Departure]] = []
    for m in moves:
        slot = next((r for r in out if all(o.dest != m.dest for o in r)), None)
        if slot is None:
            out.append([m])
        else:
            slot.append(m)
    return out
