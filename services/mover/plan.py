"""Move admission: the pure core of the coordinator (no I/O, no clock).

A move is admitted only if, on the measured rate of its path:
- the admissibility arithmetic holds (T_migrate < H and B ≥ S/H + D), and the
  moves already on that path plus this one pass the fleet test N ≤ H·B/C;
- its receiver has no in-flight move from another sender (incast: at most one
  move into a receiver that has several senders), so receivers are spread;
- it would not form a duplex pair with a move in flight the other way;
- its session is not already moving.
What does not fit is rejected with the reason; nothing is queued to run late.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from libs import admissibility
from libs.path_ewma import PathEwma
from libs.schemas.motion import MoveRequest


@dataclass(frozen=True, slots=True)
class Decision:
    admitted: bool
    reason: str
    bandwidth_bps: float
    predicted_s: float


@dataclass(slots=True)
class MovePlanner:
    prior_bps: float  # assumed rate of a path with no completed move yet
    paths: PathEwma = field(default_factory=PathEwma)  # measured rates of completed moves
    setup_s: float = 0.0
    inflight: dict[str, MoveRequest] = field(default_factory=dict)

    def rate(self, source: str, dest: str) -> float:
        return self.paths.rate(source, dest, self.prior_bps)

    def decide(self, req: MoveRequest, state_bytes: int) -> Decision:
        b = self.rate(req.source, req.dest)
        move = admissibility.Transfer(state_bytes=state_bytes, dirty_rate_bps=req.dirty_rate_bps,
                                  horizon_s=req.deadline_s, bandwidth_bps=b, setup_s=self.setup_s)
        verdict = admissibility.evaluate(move)

        def no(reason: str) -> Decision:
            return Decision(False, reason, b, verdict.t_migrate_s)

        if req.source == req.dest:
            return no("source and destination are the same host")
        for other in self.inflight.values():
            if other.session_id == req.session_id:
                return no(f"session {req.session_id} is already moving")
            if (other.source, other.dest) == (req.dest, req.source):
                return no(f"a move {other.source}->{other.dest} is in flight: no full-state duplex pairs")
            if other.dest == req.dest and other.source != req.source:
                return no(f"receiver {req.dest} already takes a move from {other.source} (incast)")
        if not verdict.admissible:
            return no(verdict.reason)
        sharing = sum((o.source, o.dest) == (req.source, req.dest) for o in self.inflight.values())
        if sharing + 1 > verdict.n_max:
            return no(f"path {req.source}->{req.dest} carries {sharing} moves; fleet test allows {verdict.n_max}")
        return Decision(True, "", b, verdict.t_migrate_s)

    def begin(self, move_id: str, req: MoveRequest) -> None:
        self.inflight[move_id] = req

    def end(self, move_id: str) -> None:
        self.inflight.pop(move_id, None)
