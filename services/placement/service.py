"""The placement service process: answers `sf.placement.place` with a host from the pure first-fit core."""

from __future__ import annotations

import time

from libs import bus, names
from libs.config import BaseConfig, PositiveFloat
from libs.live_hosts import LiveHosts
from libs.schemas.placement import Placement, PlaceRequest
from libs.service import Service
from libs.telemetry import traced
from services.placement.core import PlacementCore


class PlacementConfig(BaseConfig, kw_only=True):
    # A placement counts against its host until a heartbeat this much newer shows it.
    reservation_settle_s: PositiveFloat = 6.0


class PlacementService(Service):
    name = "placement"
    config_type = PlacementConfig

    async def setup(self) -> None:
        self.core = PlacementCore(self.config.reservation_settle_s)
        self.hosts = await LiveHosts.open(self.js, heartbeat_s=self.config.heartbeat_s,
                                          replicas=self.config.nats_replicas, log=self.log)
        await bus.serve(self.nc, names.PLACEMENT_PLACE, PlaceRequest, traced("placement.place", self._on_place),
                        queue=self.name)

    async def _on_place(self, req: PlaceRequest) -> Placement:
        placement = self.core.place(req, await self.hosts.read(), time.time())
        self.log.info("placed", session_id=req.session_id, host_id=placement.host_id,
                      busy_fraction=placement.estimate.busy_fraction)
        return placement
