"""The fence service: ownership authority (session verbs), ingress (HTTP/WebSocket) and the gateway.

Several instances may run: verbs and kicks are queue groups, the gateway's
consumer is shared, and every decision is a compare-and-set on the log, so
nothing depends on there being one instance.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from libs import bus, http_limits, names
from libs.config import HttpServerConfig, PositiveFloat, PositiveInt, section
from libs.fence import session_log
from libs.http_limits import HttpLimits
from libs.schemas.fence import (
    AssignRequest,
    CheckpointRequest,
    ClaimRequest,
    CloseRequest,
    MarkRequest,
    MetaRequest,
    RegisterRequest,
)
from libs.service import Service
from libs.telemetry import traced
from libs.ws_auth import Origins
from libs.ws_limits import SocketGate, SocketLimits
from services.fence import ownership_log
from services.fence.control_rate import ControlRate
from services.fence.egress import Egress
from services.fence.gateway import Gateway
from services.fence.ingress import Ingress
from services.fence.inputs import InputAppender
from services.fence.rtc_limits import RtcLimits
from services.fence.rtc_offer import RtcEndpoint
from services.fence.sessions import Sessions
from services.fence.summaries import mark

# Requests each instance handles at once. Every verb decides by compare-and-set (as it must with
# several instances), so they need no serializing; a failover or a host claiming thousands of
# sessions must not wait one round trip after another.
VERB_CONCURRENCY = 64
Port = Annotated[int, msgspec.Meta(ge=0, le=65535)]


class FenceConfig(HttpServerConfig, kw_only=True):
    http_host: str = "127.0.0.1"
    http_port: Port = 8701  # 0 = any free port (tests); `statefleet up` passes 8701
    max_item_bytes: PositiveInt = 64 * 1024
    max_pending_items: PositiveInt = 1024  # per session, stored but not yet released (e.g. while unclaimed)
    # per session, released to its owner beyond the applied cursor it reported: the owner's queue bound;
    # beyond it items wait unreleased, and past max_pending_items ingress answers 429
    max_unapplied_items: PositiveInt = 256
    max_contract_bytes: PositiveInt = 64 * 1024
    gateway_batch: PositiveInt = 256  # items per consumer fetch
    max_release_items: PositiveInt = 64  # items per release record and per stored input batch
    max_release_bytes: PositiveInt = 512 * 1024  # payload bytes per release record / input batch (NATS max is 1 MiB)
    # control items (clear, segment_end) per session and ingress instance: a rate and a burst; beyond, 429
    control_items_per_s: PositiveFloat = 4.0
    control_items_burst: PositiveInt = 8
    dedupe_items: PositiveInt = 256  # a resent item is recognised by its id among the session's last this many
    # Browser origins (besides the ingress's own) whose pages may open session sockets, e.g. the session
    # page admission serves; `statefleet up` sets it. Comma-separated, e.g. "http://127.0.0.1:8700".
    allowed_origins: str = ""
    # Retention (docs/configuration.md): full, a stream or bucket refuses new writes (503, retryable)
    # rather than dropping what a live session may need. A closed session's input is purged.
    session_log_max_bytes: PositiveInt = 1 << 30
    input_max_bytes: PositiveInt = 8 << 30
    input_max_age_s: PositiveFloat = 7 * 24 * 3600.0  # older items go: a session must checkpoint within this
    meta_max_bytes: PositiveInt = 256 << 20
    # WebRTC viewers (services/fence/rtc_offer.py, docs/web.md): needs the `webrtc` extra
    rtc_max_peers: PositiveInt = 64
    rtc_max_peers_per_session: PositiveInt = 4
    rtc_negotiation_timeout_s: PositiveFloat = 10.0
    rtc_max_offer_bytes: PositiveInt = 32 * 1024
    rtc_max_buffered_bytes: PositiveInt = 1 << 20
    # the only addresses ICE offers and tries (comma-separated); loopback unless fence serves other machines
    rtc_ice_addresses: str = "127.0.0.1"


class FenceService(Service):
    name = "fence"
    config_type = FenceConfig
    config: FenceConfig

    async def setup(self) -> None:
        cfg = self.config
        await session_log.provision(self.js, cfg.nats_replicas, session_log.Retention(
            log_max_bytes=cfg.session_log_max_bytes, input_max_bytes=cfg.input_max_bytes,
            input_max_age_s=cfg.input_max_age_s, meta_max_bytes=cfg.meta_max_bytes))
        kv = await self.js.key_value(names.FENCE_META_BUCKET)
        self.sessions = Sessions(self.nc, self.js, kv, max_contract_bytes=cfg.max_contract_bytes)
        self.gateway = Gateway(self.nc, self.js, batch=cfg.gateway_batch, max_release_items=cfg.max_release_items,
                               max_release_bytes=cfg.max_release_bytes, max_unapplied=cfg.max_unapplied_items)
        self.appender = InputAppender(self.js, max_group_items=cfg.max_release_items,
                                      max_group_bytes=cfg.max_release_bytes, dedupe_items=cfg.dedupe_items,
                                      on_stored=self.gateway.offer)
        for span, subject, req_type, handler in (
                ("fence.register", names.FENCE_REGISTER, RegisterRequest, self.sessions.register),
                ("fence.meta", names.FENCE_META, MetaRequest, self.sessions.meta),
                ("fence.checkpoint", names.FENCE_CHECKPOINT, CheckpointRequest, self.sessions.checkpoint),
                ("fence.close", names.FENCE_CLOSE, CloseRequest, self.sessions.close),
                ("fence.assign", names.FENCE_ASSIGN, AssignRequest, self._assign),
                ("fence.claim", names.FENCE_CLAIM, ClaimRequest, self._claim),
                ("fence.mark", names.FENCE_MARK, MarkRequest, self._mark)):
            await bus.serve(self.nc, subject, req_type, traced(span, handler, tracer_name="statefleet.fence"),
                            queue="fence", concurrency=VERB_CONCURRENCY)
        await self.nc.subscribe(names.FENCE_CLOSED, cb=self._on_closed)
        await self.gateway.start(self.spawn)
        sockets = SocketGate(section(cfg, "ws_", SocketLimits))
        self.ingress = ingress = Ingress(self.sessions, self.appender, self.gateway, Egress(self.nc, self.sessions, sockets),
                          max_item_bytes=cfg.max_item_bytes, max_pending_items=cfg.max_pending_items,
                          origins=Origins(cfg.allowed_origins.split(",")), sockets=sockets,
                          control_rate=ControlRate(per_s=cfg.control_items_per_s, burst=cfg.control_items_burst))
        app = ingress.app()
        self.rtc = RtcEndpoint(nc=self.nc, ingress=ingress, origins=ingress.origins,
                               limits=section(cfg, "rtc_", RtcLimits))
        self.rtc.add_routes(app)
        self._runner, self.http_port, self.http_guard = await http_limits.serve(
            app, cfg.http_host, cfg.http_port, section(cfg, "http_", HttpLimits), "fence")
        self.log.info("ingress_listening", host=cfg.http_host, port=self.http_port)

    async def _assign(self, request: AssignRequest):
        return await ownership_log.append_assign(self.nc, self.js, request)

    async def _claim(self, request: ClaimRequest):
        return await ownership_log.append_claim(self.js, request)

    async def _mark(self, request: MarkRequest):
        return await mark(self.nc, self.js, request)

    async def _on_closed(self, msg) -> None:
        session_id = msg.data.decode(errors="replace")
        self.sessions.evict(session_id)
        self.appender.forget(session_id)
        self.gateway.forget(session_id)

    async def teardown(self) -> None:
        await self._runner.cleanup()
        await self.appender.close()
        await self.gateway.stop()
