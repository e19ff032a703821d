"""The placement service process: a shell that wires placement's parts and serves its verbs.

Several instances run (`statefleet up` starts two); none is special. Each mirrors four KV
buckets through watches into its fleet view (`view.py`): `sf_engines` (heartbeats → liveness),
`sf_capacity` (host records: lifecycle state and reservations), `sf_sessions` (which host owns
which session, a hint) and `sf_admission` (admission's queue). Every decision is a compare-and-set:
a reservation on the host record's revision (`reservations.py`, the bucket's one writer), a
failover `assign` on the version the dead owner held (`sweeper.py`). Two instances that see the
same death both decide, converge on the same host (an existing reservation is reused) and exactly
one assign lands; the other's is refused and it lets go. An instance killed mid-failover leaves
the sessions it did not reassign stranded, and the next sweep of any instance finds them.

Sweeps are level-triggered: every `sweep_s` (and at once on a death or a new host) each
session whose owner process is dead is reassigned, or marked `orphaned` until room appears.
The other parts: `placer.py` (`sf.placement.place`), `drainer.py` (`sf.placement.drain`),
`controller.py` (rebalancing, autoscaling, idle offload; one instance at a time), and
`relocation.py`, the one live move and its settling both of those use.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from libs import bus, names
from libs.contracts import Guard
from libs.errors import StatefleetError
from libs.schemas.admission import SessionRecord
from libs.schemas.common import EngineEntry, SessionSummary
from libs.schemas.motion import MoveReceipt
from libs.schemas.placement import (
    HostInfo,
    HostList,
    HostRecord,
    HostRequest,
    HostsRequest,
    Placement,
    PlaceRequest,
)
from libs.service import Service
from libs.tasks import spawn, wait_set
from libs.telemetry import counter, histogram, traced
from services.placement.config import PlacementConfig
from services.placement.controller import TENURE_KEY, FleetController, provisioner_for
from services.placement.drainer import Drainer
from services.placement.engine_verbs import EngineVerbs
from services.placement.fence_client import FenceClient
from services.placement.liveness import Death, Liveness
from services.placement.mirror import KvMirror
from services.placement.placer import Placer
from services.placement.records import Records
from services.placement.relocation import Relocation
from services.placement.reservations import Reservations
from services.placement.sweeper import Sweeper
from services.placement.tenure import KvTenure
from services.placement.view import FleetView

__all__ = ["PlacementConfig", "PlacementService"]

_deaths = counter("sf_placement_host_deaths_total", "Engine-host processes declared dead, by reason")
_sweep_time = histogram("sf_placement_sweep", "One failover sweep", unit="s")


class PlacementService(Service):
    name = "placement"
    config_type = PlacementConfig
    config: PlacementConfig

    async def setup(self) -> None:
        cfg = self.config
        settle_s = cfg.reservation_settle_s
        self.guard = Guard(busy_fraction=cfg.guard_busy_fraction, memory_fraction=cfg.guard_memory_fraction,
                           max_sessions=cfg.max_sessions_per_host)
        self.liveness = Liveness(beats=names.HEARTBEAT_TTL_FACTOR, default_heartbeat_s=cfg.heartbeat_s,
                                 unknown_grace_s=cfg.unknown_incarnation_grace_s,
                                 fleet_quiet_limit_s=cfg.fleet_quiet_limit_s, quiet_grace_s=cfg.bus_reconnect_grace_s)
        self._wake = asyncio.Event()  # a death or a new host: sweep now
        self._heard = asyncio.Event()  # a heartbeat moved a liveness deadline

        async def bucket(name: str, ttl_s: float | None = None) -> bus.KeyValue:
            return await bus.ensure_kv(self.js, name, replicas=cfg.nats_replicas, ttl_s=ttl_s)

        capacity_kv = await bucket(names.CAPACITY_BUCKET)
        self.engines = KvMirror(self.nc, await bucket(names.ENGINES_BUCKET, ttl_s=names.ENGINES_TTL_S), EngineEntry,
                                silence_s=cfg.engine_watch_silence_s, on_change=self._on_engine)
        self.hosts = KvMirror(self.nc, capacity_kv, HostRecord, silence_s=cfg.watch_silence_s)
        self.sessions = KvMirror(self.nc, await bucket(names.SESSIONS_BUCKET), SessionSummary,
                                 silence_s=cfg.watch_silence_s)
        # admission's records: its queue (sessions no host fits yet) is load the autoscaler must see
        self.admissions = KvMirror(self.nc, await bucket(names.ADMISSION_BUCKET), SessionRecord,
                                   silence_s=cfg.watch_silence_s)
        mirrors: dict[str, KvMirror[Any]] = {"engines": self.engines, "hosts": self.hosts,
                                             "sessions": self.sessions, "admissions": self.admissions}
        for what, mirror in mirrors.items():
            self.spawn(mirror.run(), f"mirror_{what}")
        async with asyncio.timeout(cfg.nats_connect_timeout_s + cfg.watch_silence_s):
            for mirror in mirrors.values():
                await mirror.ready.wait()

        self.view = FleetView(self.liveness, self.engines, self.hosts, self.sessions, self.admissions)
        self.fence = FenceClient(nc=self.nc, js=self.js)
        self.reservations = Reservations(records=Records(capacity_kv), view=self.view, specs=self.fence,
                                         guard=self.guard, settle_s=settle_s)
        relocation = Relocation(nc=self.nc, owners=self.fence, reservations=self.reservations,
                                deadline_s=cfg.drain_move_deadline_s)
        self.placer = Placer(view=self.view, specs=self.fence, reservations=self.reservations, config=cfg,
                             settle_s=settle_s, log=self.log)
        self.sweeper = Sweeper(view=self.view, owners=self.fence, reservations=self.reservations, guard=self.guard,
                               config=cfg, settle_s=settle_s, grace_s=cfg.reservation_grace_s, log=self.log)
        self.drainer = Drainer(view=self.view, owners=self.fence, reservations=self.reservations,
                               relocation=relocation, guard=self.guard, config=cfg, settle_s=settle_s, log=self.log)
        tenure_kv = await bucket(names.PLACEMENT_TENURE_BUCKET)
        self.fleet = FleetController(
            config=cfg, guard=self.guard, settle_s=settle_s,
            tenure=KvTenure(tenure_kv, TENURE_KEY, self.instance, ttl_s=cfg.tenure_ttl_s, margin_s=cfg.tenure_ttl_s / 3),
            view=self.view, owners=self.fence, reservations=self.reservations, relocation=relocation,
            engines=EngineVerbs(nc=self.nc), drainer=self.drainer, provisioner=provisioner_for(cfg), log=self.log)
        self.spawn(self.fleet.run(), "fleet")
        self.spawn(self._expire_loop(), "liveness")
        self.spawn(self._sweep_loop(), "sweep")
        for subject, span, req_type, handler in (
                (names.PLACEMENT_PLACE, "placement.place", PlaceRequest, self._on_place),
                (names.PLACEMENT_HOSTS, "placement.hosts", HostsRequest, self._on_hosts),
                (names.PLACEMENT_DRAIN, "placement.drain", HostRequest, self.drainer.drain),
                (names.PLACEMENT_UNDRAIN, "placement.undrain", HostRequest, self._on_undrain)):
            await bus.serve(self.nc, subject, req_type, traced(span, handler), queue=self.name, concurrency=8)
        # every instance learns the paths' measured rates, so a new tenure holder plans with them too
        await bus.subscribe_events(self.nc, names.MOVE_RECEIPT_SUBJECTS, MoveReceipt, self._on_receipt)

    async def _on_receipt(self, r: MoveReceipt) -> None:
        if r.outcome == "committed":
            self.fleet.paths.observe(r.source, r.dest, r.wire_bytes, r.transfer_s)

    def live_hosts(self) -> list[EngineEntry]:
        return self.view.live_hosts()

    def owned(self, host_id: str) -> list[SessionSummary]:
        return self.view.owned(host_id)

    # ------------------------------------------------------------ liveness

    def _on_engine(self, host_id: str, entry: EngineEntry | None) -> None:
        now = time.monotonic()
        if entry is None:
            deaths = self.liveness.deleted(host_id)
        else:
            new = host_id not in self.liveness.live
            deaths = self.liveness.observe(entry, now)
            if new:
                self._wake.set()  # room appeared: orphans may fit now
        self._heard.set()
        for d in deaths:
            spawn(self._on_death(d), name=f"placement:death:{d.host_id}", event="death_handling_failed")

    async def _expire_loop(self) -> None:
        reconnects = self.nc.stats["reconnects"]
        while True:
            deadline = self.liveness.next_deadline()
            wait = 1.0 if deadline is None else max(0.0, deadline - time.monotonic())
            self._heard.clear()
            await wait_set(self._heard, wait)
            if not self.engines.current:
                # We cannot hear heartbeats (our connection or watch was lost): silence says nothing about
                # the hosts. Once the re-opened watch has caught up, every live host is heard afresh.
                self.liveness.postpone(time.monotonic())
                continue
            if self.nc.stats["reconnects"] != reconnects:  # we were away: hosts may not have reconnected yet
                reconnects = self.nc.stats["reconnects"]
                self.liveness.postpone(time.monotonic(), self.config.bus_reconnect_grace_s)
                self.log.info("liveness_grace_after_reconnect", grace_s=self.config.bus_reconnect_grace_s)
                continue
            for d in self.liveness.expire(time.monotonic()):
                await self._on_death(d)

    async def _on_death(self, death: Death) -> None:
        _deaths.add(1, {"reason": death.reason})
        self.log.warning("host_dead", host_id=death.host_id, incarnation=death.incarnation, reason=death.reason,
                         successor=death.successor)
        self._wake.set()
        try:
            await self.reservations.after_death(death.host_id, death.incarnation, death.successor)
        except StatefleetError as e:  # the next sweep's reconciliation unreserves them instead
            self.log.warning("death_unreserve_failed", host_id=death.host_id, code=e.code)

    # ------------------------------------------------------------ failover

    async def _sweep_loop(self) -> None:
        while True:
            await wait_set(self._wake, self.config.sweep_s)
            self._wake.clear()
            started = time.monotonic()
            try:
                await self.sweeper.sweep()
                await self.sweeper.reconcile()
            except StatefleetError as e:  # NATS trouble: the next sweep tries again
                self.log.warning("sweep_failed", code=e.code, detail=e.detail)
            _sweep_time.record(time.monotonic() - started)

    # ------------------------------------------------------------ verbs

    async def _on_place(self, req: PlaceRequest) -> Placement:
        return await self.placer.place(req)

    async def _on_hosts(self, _: HostsRequest) -> HostList:
        return HostList(hosts=[self.view.host_info(h) for h in sorted(self.view.host_ids())])

    async def _on_undrain(self, req: HostRequest) -> HostInfo:
        self.view.check_known(req.host_id)
        record = await self.reservations.set_state(req.host_id, "up")
        self.log.info("host_undrained", host_id=req.host_id)
        self._wake.set()
        return self.view.host_info(req.host_id, record)
