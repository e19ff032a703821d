"""Initial placement as a pure core: capacity-aware first fit over the engine hosts' heartbeats.

Hosts are tried in host_id order; the first whose residual capacity (measured load
less placements its heartbeat does not show yet, less the guard band) takes the
session at its quality floor wins. A retry for a session still pending gets the
same host back, so a lost reply never places one session twice.
"""

from __future__ import annotations

from collections.abc import Sequence

from libs.contracts import Demand, Reservations, estimate
from libs.errors import Rejected
from libs.schemas.common import EngineEntry
from libs.schemas.placement import Placement, PlaceRequest


class PlacementCore:
    def __init__(self, settle_s: float) -> None:
        self.reservations = Reservations(settle_s)
        self._placed: dict[str, Placement] = {}

    def place(self, req: PlaceRequest, hosts: Sequence[EngineEntry], now: float) -> Placement:
        """The first host that fits `req`, reserved there; `Rejected(reason="no_fit")` when none does."""
        ordered = sorted(hosts, key=lambda h: h.host_id)
        pending = {h.host_id: self.reservations.on(h) for h in ordered}  # settles what heartbeats show
        self._placed = {sid: p for sid, p in self._placed.items() if self.reservations.host_of(sid)}
        if req.session_id in self._placed:
            return self._placed[req.session_id]
        ests = [estimate(req.contract, req.backend, h, pending[h.host_id], req.guard) for h in ordered]
        chosen = next((e for e in ests if e.fits), None)
        if chosen is None:
            raise Rejected(f"no engine host fits session {req.session_id}", reason="no_fit",
                           session_id=req.session_id, hosts=",".join(f"{e.host_id}:{e.reason}" for e in ests))
        self.reservations.add(req.session_id, chosen.host_id,
                              Demand(busy_fraction=chosen.busy_fraction, state_bytes=chosen.state_bytes), now)
        placement = Placement(session_id=req.session_id, host_id=chosen.host_id, estimate=chosen)
        self._placed[req.session_id] = placement
        return placement
