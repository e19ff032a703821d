"""Initial placement (`sf.placement.place`): the least busy fitting host for a new session, reserved by CAS.

One placement at a time per instance, each seeing the last one's reservation (the mirror is told
at once, `KvMirror.wrote`): placed concurrently from one view, a burst of sessions would all go
to the host that was least busy. A retry gets the same host while its reservation stands.
"""

from __future__ import annotations

import asyncio

import structlog

from libs.errors import Rejected
from libs.schemas.placement import HostRecord, Placement, PlaceRequest
from services.placement import capacity
from services.placement.fence_client import FenceClient
from services.placement.reservations import Reservations
from services.placement.view import FleetView


class Placer:
    def __init__(self, *, view: FleetView, specs: FenceClient, reservations: Reservations, settle_s: float,
                 log: structlog.typing.FilteringBoundLogger) -> None:
        self.view, self.specs, self.reservations, self.settle_s, self.log = view, specs, reservations, settle_s, log
        self._placed: dict[str, Placement] = {}
        self._placing = asyncio.Lock()

    async def place(self, req: PlaceRequest) -> Placement:
        async with self._placing:
            return await self._place_one(req)

    async def _place_one(self, req: PlaceRequest) -> Placement:
        sid = req.session_id
        done = self._placed.get(sid)
        if done is not None and sid in self.view.records().get(done.host_id, HostRecord(host_id="")).sessions:
            return done
        self.specs.remember(sid, req.contract, req.backend)
        ests = capacity.by_room(req.contract, req.backend, self.view.live_hosts(), self.view.records(), req.guard,
                                 self.settle_s)
        for est in (e for e in ests if e.fits):
            host = self.view.entry(est.host_id)
            if host is None:
                continue
            try:
                record = await self.reservations.reserve_for(sid, est.host_id, req.contract, req.backend, req.guard,
                                                             host.incarnation)
            except Rejected:
                continue  # filled up since the mirror showed it: the next host in order
            self.view.hosts.wrote(est.host_id, record)
            placement = Placement(session_id=sid, host_id=est.host_id, estimate=est, incarnation=host.incarnation)
            self._placed[sid] = placement
            self.log.info("placed", session_id=sid, host_id=est.host_id, busy_fraction=est.busy_fraction)
            return placement
        raise Rejected(f"no engine host fits session {sid}", reason="no_fit", session_id=sid,
                       hosts=",".join(f"{e.host_id}:{e.reason}" for e in ests))
