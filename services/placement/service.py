"""The placement service process: answers `sf.placement.place` with a host from the pure first-fit core."""

from __future__ import annotations

import time

import nats.js.errors

from libs import bus, names
from libs.config import BaseConfig, PositiveFloat
from libs.errors import SchemaError
from libs.schemas.base import decode
from libs.schemas.common import EngineEntry
from libs.schemas.placement import Placement, PlaceRequest
from libs.service import Service
from libs.telemetry import tracer
from services.placement.core import PlacementCore


class PlacementConfig(BaseConfig, kw_only=True):
    # A placement counts against its host until a heartbeat this much newer shows it.
    reservation_settle_s: PositiveFloat = 6.0


class PlacementService(Service):
    name = "placement"
    config_type = PlacementConfig

    async def setup(self) -> None:
        self.core = PlacementCore(self.config.reservation_settle_s)
        self.engines_kv = await bus.ensure_kv(self.js, names.ENGINES_BUCKET,
                                              ttl_s=self.config.heartbeat_s * names.HEARTBEAT_TTL_FACTOR,
                                              replicas=self.config.nats_replicas)
        await bus.serve(self.nc, names.PLACEMENT_PLACE, PlaceRequest, self._on_place, queue=self.name)

    async def _on_place(self, req: PlaceRequest) -> Placement:
        with tracer().start_as_current_span("placement.place", attributes={"session_id": req.session_id}):
            hosts = await self._live_engines()
            placement = self.core.place(req, hosts, time.time())
        self.log.info("placed", session_id=req.session_id, host_id=placement.host_id,
                      busy_fraction=placement.estimate.busy_fraction)
        return placement

    async def _live_engines(self) -> list[EngineEntry]:
        """Every engine host whose heartbeat is younger than the bucket's TTL (expired keys may linger)."""
        try:
            keys = await self.engines_kv.keys()
        except nats.js.errors.NoKeysError:
            return []
        oldest = time.time() - self.config.heartbeat_s * names.HEARTBEAT_TTL_FACTOR
        hosts = []
        for key in keys:
            try:
                entry = decode((await self.engines_kv.get(key)).value, EngineEntry)
            except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
                continue  # expired or left between listing and reading
            except SchemaError as e:
                self.log.warning("engine_entry_undecodable", host_id=key, detail=e.detail)
                continue
            if entry.heartbeat_at >= oldest:
                hosts.append(entry)
        return hosts
