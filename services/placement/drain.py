"""Drain decisions: where each of a host's sessions goes, and in which rounds. Pure: no I/O, clock passed in.

Every session goes to the live, undrained host (not the one draining) the fleet policy's placement
function chooses (`choice.py`, in its `spread` form: the host holding the fewest sessions within the
best rank), each decision seeing the reservations before it. Moves run in rounds in
which no receiver takes two sessions, so the mover's incast rule never rejects one of
ours and no receiver's link is shared within a round.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from libs.contracts import Estimate
from libs.schemas.common import EngineEntry
from libs.schemas.placement import HostRecord
from services.placement import capacity, choice
from services.placement.failover import Stranded
from services.placement.policy import Params, PathRates


@dataclass(frozen=True, slots=True)
class Departure:
    """Where one of a draining host's sessions goes: by a live move, or a hand-over if the move is refused."""

    session_id: str
    dest: str
    incarnation: str
    version: int  # the draining host's version of the session: hand-overs compare-and-set on it
    estimate: Estimate


def plan_moves(source: str, sessions: Sequence[Stranded], hosts: Sequence[EngineEntry],
               records: Mapping[str, HostRecord], params: Params, settle_s: float,
               now: float, *, paths: PathRates) -> tuple[list[Departure], list[tuple[str, list[Estimate]]]]:
    """(moves, sessions no other host has room for with every host's estimate)."""
    records = dict(records)
    by_id = {h.host_id: h for h in hosts}
    moves: list[Departure] = []
    no_room: list[tuple[str, list[Estimate]]] = []
    for s in sorted(sessions, key=lambda s: s.session_id):
        assert s.view.owner is not None
        got = choice.choose(choice.wanted(s.session_id, s.contract, s.backend, threads=s.threads), hosts=hosts,
                            records=records, params=params, settle_s=settle_s, paths=paths, exclude=[source],
                            spread=True)
        best = got.estimate
        if best is None:
            no_room.append((s.session_id, got.estimates))
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
