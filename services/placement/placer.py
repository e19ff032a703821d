"""Initial placement (`sf.placement.place`): the fleet policy's host for a new session (`choice.py`, the
placement function the simulator runs), reserved by CAS.

One placement at a time per instance, each seeing the last one's reservation (the mirror is told
at once, `KvMirror.wrote`): placed concurrently from one view, a burst of sessions would all go
to the one host the policy liked best. A retry gets the same host while its reservation stands.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import structlog

from libs.errors import Rejected
from libs.schemas.placement import HostRecord, Placement, PlaceRequest
from services.placement import choice
from services.placement.control_config import FleetControlConfig
from services.placement.fence_client import FenceClient
from services.placement.policy import PathRates
from services.placement.reservations import Reservations
from services.placement.view import FleetView


class Placer:
    def __init__(self, *, view: FleetView, specs: FenceClient, reservations: Reservations,
                 config: FleetControlConfig, settle_s: float, log: structlog.typing.FilteringBoundLogger) -> None:
        self.view, self.specs, self.reservations, self.settle_s, self.log = view, specs, reservations, settle_s, log
        self.config = config  # the policy's knobs, read at each placement (as the fleet controller reads them)
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
        # The policy's host first; should its compare-and-set find it filled up since the mirror showed it,
        # the choice is made again on the records as they are now, without the hosts already tried.
        tried: list[str] = []
        while (est := self._choose(req, tried).estimate) is not None:
            host = self.view.entry(est.host_id)
            tried.append(est.host_id)
            if host is None:
                continue
            try:
                record = await self.reservations.reserve_for(sid, est.host_id, req.contract, req.backend, req.guard,
                                                             host.incarnation)
            except Rejected:
                continue  # filled up since the mirror showed it
            self.view.hosts.wrote(est.host_id, record)
            placement = Placement(session_id=sid, host_id=est.host_id, estimate=est, incarnation=host.incarnation)
            self._placed[sid] = placement
            self.log.info("placed", session_id=sid, host_id=est.host_id, busy_fraction=est.busy_fraction)
            return placement
        refused = self._choose(req, ())  # every host's reason, the ones tried included
        raise Rejected(f"no engine host fits session {sid}", reason="no_fit", session_id=sid,
                       hosts=",".join(f"{e.host_id}:{e.reason}" for e in refused.estimates))

    def _choose(self, req: PlaceRequest, exclude: Sequence[str]) -> choice.Choice:
        hosts = self.view.live_hosts()
        if req.hosts:  # the hosts admission lets the session go to; the others only pool their device's load
            exclude = [*exclude, *(h.host_id for h in hosts if h.host_id not in req.hosts)]
        return choice.choose(choice.wanted(req.session_id, req.contract, req.backend), hosts=hosts,
                             records=self.view.records(), params=self.config.params(req.guard),
                             settle_s=self.settle_s, paths=PathRates(default_bps=self.config.path_bps),
                             residents=choice.residents_of(self.view.summaries(), self.specs.known(), hosts),
                             exclude=exclude)
