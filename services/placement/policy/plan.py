"""A decision's working state: each host's load as the snapshot shows it plus what this decision added.

Fit verdicts come from `libs.contracts.estimate` (the one capacity model admission also uses):
whatever this decision already placed or moved onto a host counts as pending demand there, so
no two actions of one decision share one gap. A session moving away still counts on its source
until the move commits; only latency predictions credit the source at once.
"""

from __future__ import annotations

from libs import admissibility
from libs.contracts import Demand, Estimate, demand, estimate, floor_row
from libs.schemas.common import ProfileRow
from services.placement.policy import latency
from services.placement.policy.params import Params
from services.placement.policy.snapshot import Fleet, Host, Session


class HostLoad:
    __slots__ = ("host", "pending", "terms", "busy", "ms", "receiving", "sending")

    def __init__(self, host: Host) -> None:
        self.host = host
        self.pending: list[Demand] = list(host.reserved)
        self.terms: dict[str, latency.Term] = {}
        self.busy = host.entry.busy_fraction + sum(d.busy_fraction for d in host.reserved)
        self.ms = 0.0
        self.receiving = host.moves_in  # moves towards it: in flight, plus this decision's
        self.sending = 0

    @property
    def host_id(self) -> str:
        return self.host.host_id

    @property
    def open(self) -> bool:
        """Takes new sessions: up, not draining."""
        return self.host.state == "up"


class Plan:
    def __init__(self, fleet: Fleet, params: Params) -> None:
        self.fleet, self.params = fleet, params
        self.loads = {h.host_id: HostLoad(h) for h in fleet.hosts}
        self.sessions = {s.session_id: s for s in fleet.sessions}
        self.claimed: set[str] = set()  # sessions this decision already acts on: one action each
        self._rows: dict[tuple[int, str, int], ProfileRow | None] = {}
        # Keyed by object identity: every object keyed here lives in `fleet` for the plan's lifetime.
        self._terms: dict[tuple[int, str, int], latency.Term | None] = {}
        loads = self.loads
        for s in fleet.sessions:
            if s.state == "serving" or s.state == "moving":
                hl = loads.get(s.host_id)
                if hl is not None:
                    t = self.term(s, hl)
                    if t is not None:
                        hl.terms[s.session_id] = t
        for hl in self.loads.values():
            self.refresh(hl)
        self._zone_nics = _zone_nics(self)

    # ------------------------------------------------------------ capacity (libs.contracts)

    def row(self, s: Session, hl: HostLoad) -> ProfileRow | None:
        profile = hl.host.entry.profile
        key = (id(profile), s.backend, s.contract.quality_floor)
        if key not in self._rows:
            self._rows[key] = floor_row(profile, s.backend, s.contract.quality_floor)
        return self._rows[key]

    def term(self, s: Session, hl: HostLoad) -> latency.Term | None:
        key = (id(hl.host.entry.profile), s.backend, id(s.contract))
        if key not in self._terms:
            row = self.row(s, hl)
            self._terms[key] = None if row is None else latency.term(s.contract, row,
                                                                     demand(s.contract, row).busy_fraction)
        return self._terms[key]

    def fit(self, s: Session, hl: HostLoad) -> Estimate:
        return estimate(s.contract, s.backend, hl.host.entry, hl.pending, self.params.guard)

    # ------------------------------------------------------------ latency predictions

    def refresh(self, hl: HostLoad) -> None:
        hl.ms = latency.host_ms(self.params, hl.terms.values(), hl.busy)

    def ms_with(self, hl: HostLoad, t: latency.Term) -> float:
        return latency.host_ms(self.params, [*hl.terms.values(), t], hl.busy + t.share)

    def ms_without(self, hl: HostLoad, session_id: str) -> float:
        t = hl.terms[session_id]
        rest = [v for k, v in hl.terms.items() if k != session_id]
        return latency.host_ms(self.params, rest, hl.busy - t.share)

    # ------------------------------------------------------------ applying this decision's actions

    def add(self, s: Session, hl: HostLoad, est: Estimate) -> None:
        self.claimed.add(s.session_id)
        hl.pending.append(Demand(busy_fraction=est.busy_fraction, state_bytes=est.state_bytes))
        t = self.term(s, hl)
        if t is not None:
            hl.terms[s.session_id] = t
            hl.busy += t.share
        self.refresh(hl)

    def take_away(self, s: Session, hl: HostLoad) -> None:
        t = hl.terms.pop(s.session_id, None)
        if t is not None:
            hl.busy -= t.share
        self.refresh(hl)

    # ------------------------------------------------------------ moves

    def move_verdict(self, s: Session, src: HostLoad, dst: HostLoad) -> admissibility.MoveVerdict:
        p = self.params
        return admissibility.evaluate(admissibility.Move(
            state_bytes=s.state_bytes, dirty_rate_bps=s.dirty_rate_bps, horizon_s=p.move_horizon_s,
            bandwidth_bps=self.fleet.paths.rate(src.host, dst.host), setup_s=p.move_setup_s))

    def stall_ms(self, s: Session, bandwidth_bps: float, window_ms: float) -> float:
        """κ: a live move freezes the session for its last round, about one window's dirty bytes."""
        dirty = s.dirty_rate_bps * (window_ms or 1000.0) / 1e3
        return 1e3 * (self.params.move_setup_s + dirty / bandwidth_bps)

    def movable(self, s: Session) -> bool:
        p, now = self.params, self.fleet.now
        if s.state != "serving" or s.session_id in self.claimed:
            return False
        recent = [t for t in s.moves if t > now - p.move_window_s]
        if len(recent) >= p.max_moves_per_window:
            return False
        return not s.moves or now - max(s.moves) >= p.move_cooldown_s

    def escape_bps(self, hl: HostLoad) -> float:
        """The best rate out of this host to another open host: what a future move off it could use."""
        paths, own = self.fleet.paths, hl.host.nic_bps or self.fleet.paths.default_bps
        best = 0.0
        for zone, nics in self._zone_nics.items():
            same = zone == hl.host.zone
            if same and hl.open and nics[0] == own:
                nics = nics[1:]  # itself
            if nics:
                best = max(best, min(own, nics[0]) if same else min(own, nics[0], paths.cross_zone_bps))
        return best

    def open_loads(self) -> list[HostLoad]:
        return [hl for hl in self.loads.values() if hl.open]


def _zone_nics(plan: Plan) -> dict[str, list[float]]:
    """Per zone, the NIC rates of its open hosts, fastest first."""
    out: dict[str, list[float]] = {}
    for hl in plan.open_loads():
        out.setdefault(hl.host.zone, []).append(hl.host.nic_bps or plan.fleet.paths.default_bps)
    for nics in out.values():
        nics.sort(reverse=True)
    return out
