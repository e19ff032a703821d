"""The placement service process: initial placement, host liveness, failover, capacity reservations, drain,
and the fleet controller (`controller.py`: rebalancing, autoscaling, idle offload; one instance at a time).

Several instances run (`statefleet up` starts two); none is special. Each mirrors three KV
buckets through watches: `sf_engines` (heartbeats → liveness), `sf_capacity` (host records:
lifecycle state and reservations) and `sf_sessions` (which host owns which session, a hint).
Every decision is a compare-and-set: a reservation on the host record's revision, a failover
`assign` on the version the dead owner held. Two instances that see the same death both
decide, converge on the same host (an existing reservation is reused) and exactly one
assign lands; the other's is refused and it lets go. An instance killed mid-failover leaves
the sessions it did not reassign stranded, and the next sweep of any instance finds them.

Sweeps are level-triggered: every `sweep_s` (and at once on a death or a new host) each
session whose owner process is dead is reassigned, or marked `orphaned` until room appears.
"""

from __future__ import annotations

import asyncio
import time
from typing import Annotated

import msgspec

from libs import bus, names
from libs.config import PositiveFloat, PositiveInt
from libs.contracts import Contract, Guard
from libs.errors import Conflict, NotFound, Rejected, StatefleetError
from libs.fence.ownership import assign, read_owner, update_summary
from libs.schemas.admission import SessionRecord
from libs.schemas.common import EngineEntry, SessionSummary
from libs.schemas.fence import MetaRequest, Owner, SessionMeta, SessionView
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
from services.placement import capacity, device_cas, failover
from services.placement.control_config import FleetControlConfig
from services.placement.controller import FleetController, provisioner_for
from services.placement.drainer import Drainer
from services.placement.liveness import Death, Liveness
from services.placement.mirror import KvMirror
from services.placement.records import Records

_deaths = counter("sf_placement_host_deaths_total", "Engine-host processes declared dead, by reason")
_failovers = counter("sf_placement_failovers_total", "Failover decisions by outcome")
_sweep_time = histogram("sf_placement_sweep", "One failover sweep", unit="s")

Fraction = Annotated[float, msgspec.Meta(ge=0, lt=1)]


class PlacementConfig(FleetControlConfig, kw_only=True):
    # A reservation counts against its host until a heartbeat this much newer shows it (covers clock skew).
    reservation_settle_s: PositiveFloat = 6.0
    # The guard band kept free on every host by failover and drain (admission passes its own for new sessions).
    guard_busy_fraction: Fraction = 0.1
    guard_memory_fraction: Fraction = 0.05
    max_sessions_per_host: PositiveInt = 64
    sweep_s: PositiveFloat = 1.0  # stranded and orphaned sessions are looked at again this often
    # An owner process never seen in a heartbeat counts as dead after this long (it may be newer than our view).
    unknown_incarnation_grace_s: PositiveFloat = 6.0
    # A reservation whose session fence shows owned elsewhere (moved out, lost race) is released after this.
    reservation_grace_s: PositiveFloat = 30.0
    drain_move_deadline_s: PositiveFloat = 10.0  # each live move's horizon during a drain
    # A watch silent this long is re-opened (engines beat every 0.5 s, so theirs is short).
    engine_watch_silence_s: PositiveFloat = 3.0
    # After placement's own connection to the bus comes back, hosts get this long to reconnect and beat
    # before silence counts (their heartbeat entries may have expired while the bus was down).
    bus_reconnect_grace_s: PositiveFloat = 10.0
    # Every host silent at once reads as the bus failing beneath them, for at most this long.
    fleet_quiet_limit_s: PositiveFloat = 30.0
    watch_silence_s: PositiveFloat = 10.0


class PlacementService(Service):
    name = "placement"
    config_type = PlacementConfig
    config: PlacementConfig

    async def setup(self) -> None:
        cfg = self.config
        self.guard = Guard(busy_fraction=cfg.guard_busy_fraction, memory_fraction=cfg.guard_memory_fraction,
                           max_sessions=cfg.max_sessions_per_host)
        self.liveness = Liveness(beats=names.HEARTBEAT_TTL_FACTOR, default_heartbeat_s=cfg.heartbeat_s,
                                 unknown_grace_s=cfg.unknown_incarnation_grace_s,
                                 fleet_quiet_limit_s=cfg.fleet_quiet_limit_s, quiet_grace_s=cfg.bus_reconnect_grace_s)
        self._wake = asyncio.Event()  # a death or a new host: sweep now
        self._heard = asyncio.Event()  # a heartbeat moved a liveness deadline
        self._placed: dict[str, Placement] = {}
        self._placing = asyncio.Lock()  # see _on_place
        self._specs: dict[str, tuple[Contract, str]] = {}  # session → (contract, backend): never changes
        self._orphans: set[str] = set()
        engines_kv = await bus.ensure_kv(self.js, names.ENGINES_BUCKET, replicas=cfg.nats_replicas,
                                         ttl_s=names.ENGINES_TTL_S)
        capacity_kv = await bus.ensure_kv(self.js, names.CAPACITY_BUCKET, replicas=cfg.nats_replicas)
        sessions_kv = await bus.ensure_kv(self.js, names.SESSIONS_BUCKET, replicas=cfg.nats_replicas)
        self.records = Records(capacity_kv)
        self.engines = KvMirror(self.nc, engines_kv, EngineEntry, silence_s=cfg.engine_watch_silence_s,
                                on_change=self._on_engine)
        self.hosts = KvMirror(self.nc, capacity_kv, HostRecord, silence_s=cfg.watch_silence_s)
        self.sessions = KvMirror(self.nc, sessions_kv, SessionSummary, silence_s=cfg.watch_silence_s)
        # admission's records: its queue (sessions no host fits yet) is load the autoscaler must see
        admission_kv = await bus.ensure_kv(self.js, names.ADMISSION_BUCKET, replicas=cfg.nats_replicas)
        self.admissions = KvMirror(self.nc, admission_kv, SessionRecord, silence_s=cfg.watch_silence_s)
        for mirror, what in ((self.engines, "engines"), (self.hosts, "hosts"), (self.sessions, "sessions"),
                             (self.admissions, "admissions")):
            self.spawn(mirror.run(), f"mirror_{what}")
        async with asyncio.timeout(cfg.nats_connect_timeout_s + cfg.watch_silence_s):
            for mirror in (self.engines, self.hosts, self.sessions, self.admissions):
                await mirror.ready.wait()
        self.drainer = Drainer(self)
        lease_kv = await bus.ensure_kv(self.js, names.PLACEMENT_LEASE_BUCKET, replicas=cfg.nats_replicas)
        self.fleet = FleetController(self, lease_kv, provisioner_for(self))
        self.spawn(self.fleet.run(), "fleet")
        self.spawn(self._expire_loop(), "liveness")
        self.spawn(self._sweep_loop(), "sweep")
        for subject, span, req_type, handler in (
                (names.PLACEMENT_PLACE, "placement.place", PlaceRequest, self._on_place),
                (names.PLACEMENT_HOSTS, "placement.hosts", HostsRequest, self._on_hosts),
                (names.PLACEMENT_DRAIN, "placement.drain", HostRequest, self.drainer.drain),
                (names.PLACEMENT_UNDRAIN, "placement.undrain", HostRequest, self._on_undrain)):
            await bus.serve(self.nc, subject, req_type, traced(span, handler), queue=self.name, concurrency=8)
        # every instance learns the paths' measured rates, so a new lease holder plans with them too
        await bus.subscribe_events(self.nc, names.MOVE_RECEIPT_SUBJECTS, MoveReceipt, self._on_receipt)

    async def _on_receipt(self, r: MoveReceipt) -> None:
        if r.outcome == "committed":
            self.fleet.paths.observe(r.source, r.dest, r.wire_bytes, r.transfer_s)

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
            await self.records.change(death.host_id,
                                      lambda r: capacity.after_death(r, death.incarnation, death.successor))
        except StatefleetError as e:  # the next sweep's reconciliation releases them instead
            self.log.warning("death_release_failed", host_id=death.host_id, code=e.code)

    def live_hosts(self) -> list[EngineEntry]:
        return self.liveness.hosts()

    # ------------------------------------------------------------ failover

    async def _sweep_loop(self) -> None:
        while True:
            await wait_set(self._wake, self.config.sweep_s)
            self._wake.clear()
            started = time.monotonic()
            try:
                await self.sweep()
                await self._reconcile()
            except StatefleetError as e:  # NATS trouble: the next sweep tries again
                self.log.warning("sweep_failed", code=e.code, detail=e.detail)
            _sweep_time.record(time.monotonic() - started)

    async def sweep(self) -> None:
        """Reassign every session whose owner process is dead; orphan the ones nothing has room for."""
        now = time.monotonic()
        states = {s.session_id: failover.owner_state(_hinted_view(s), self.liveness, now)
                  for s in list(self.sessions.values.values()) if s.state != "closed" and s.owner_server_id}
        summaries = self.sessions.values
        for sid in [sid for sid, st in states.items() if st == "alive" and summaries[sid].state == "orphaned"]:
            # Its owner turned out alive (it was heard again): the summary says what the log says.
            await update_summary(self.js, sid, (await read_owner(self.js, sid)).view)
        suspects = [summaries[sid] for sid, st in states.items() if st == "dead"]
        stranded = []
        for s in suspects:
            try:
                tail = await read_owner(self.js, s.session_id)
                if failover.owner_state(tail.view, self.liveness, now) != "dead":
                    continue
                contract, backend = await self.spec(s.session_id)
            except StatefleetError as e:
                self.log.info("stranded_unread", session_id=s.session_id, code=e.code)
                continue
            stranded.append(failover.Stranded(s.session_id, tail.view, contract, backend))
        if not stranded:
            return
        decisions = failover.plan(stranded, self._up_hosts(), self.hosts.values, self.guard,
                                  self.config.reservation_settle_s, time.time())
        views = {s.session_id: s.view for s in stranded}
        await asyncio.gather(*(self._carry_out(d, views[d.session_id]) for d in decisions))

    async def _carry_out(self, d: failover.Reassign | failover.Orphan, view: SessionView) -> None:
        sid = d.session_id
        if isinstance(d, failover.Orphan):
            _failovers.add(1, {"outcome": "orphaned"})
            if sid not in self._orphans:
                self._orphans.add(sid)
                self.log.warning("session_orphaned", session_id=sid,
                                 hosts=",".join(f"{e.host_id}:{e.reason}" for e in d.estimates))
            summary = self.sessions.values.get(sid)
            if summary is None or summary.state != "orphaned":
                await update_summary(self.js, sid, view, state="orphaned")
            return
        try:
            if not d.reserved:
                await self.reserve(sid, d.host_id, d.estimate.busy_fraction, d.estimate.state_bytes, d.incarnation)
            await assign(self.nc, self.js, sid, d.host_id, expect_version=d.expect_version,
                         incarnation=d.incarnation)
        except Rejected:  # the host filled up (or started draining) since we looked: the next sweep re-plans
            _failovers.add(1, {"outcome": "no_room_on_cas"})
            return
        except Conflict:
            # Another placer (or a move) got there first: keep the reservation only if it chose our host.
            owner = (await read_owner(self.js, sid)).view.owner
            if owner is None or owner.server_id != d.host_id:
                await self.release(d.host_id, [sid])
            _failovers.add(1, {"outcome": "lost_race"})
            return
        self._orphans.discard(sid)
        _failovers.add(1, {"outcome": "reassigned"})
        self.log.info("failed_over", session_id=sid, host_id=d.host_id, version=d.expect_version + 1,
                      dead_owner=view.owner.server_id if view.owner else "")

    async def reserve(self, sid: str, host_id: str, busy_fraction: float, state_bytes: int,
                      incarnation: str) -> HostRecord:
        """Reserve the session's demand on the host by CAS; `Rejected` if the fresh record has no room."""
        contract, backend = await self.spec(sid)
        host = self.liveness.entry(host_id)
        if host is None:
            raise Rejected(f"host {host_id} is not live", reason="no_fit", host_id=host_id)

        def take(view: EngineEntry, record: HostRecord) -> HostRecord:
            est = capacity.fit(contract, backend, view, capacity.release(record, [sid]), self.guard,
                               self.config.reservation_settle_s)
            if not est.fits:
                raise Rejected(f"host {host_id}: {est.reason}", reason="no_fit", host_id=host_id)
            return capacity.reserve(record, sid, est, incarnation, time.time())

        return await device_cas.reserve(self.records, host, self.live_hosts(), self.config.reservation_settle_s,
                                        sid, take)

    async def release(self, host_id: str, sids: list[str]) -> None:
        await self.records.change(host_id, lambda r: capacity.release(r, sids))

    async def _reconcile(self) -> None:
        """Release reservations of sessions that closed, or that fence shows owned elsewhere for a while."""
        now = time.time()
        for host_id, record in list(self.hosts.values.items()):
            stale = []
            for sid, r in record.sessions.items():
                s = self.sessions.values.get(sid)
                if s is not None and s.state == "closed":
                    stale.append(sid)
                elif now - r.at > self.config.reservation_grace_s and (s is None or s.owner_server_id != host_id):
                    stale.append(sid)
            if stale:
                await self.release(host_id, stale)

    async def spec(self, sid: str) -> tuple[Contract, str]:
        if sid not in self._specs:
            meta = await bus.request(self.nc, names.FENCE_META, MetaRequest(session_id=sid), SessionMeta)
            self._specs[sid] = (msgspec.msgpack.decode(meta.contract, type=Contract), meta.backend)
        return self._specs[sid]

    def _up_hosts(self) -> list[EngineEntry]:
        return [h for h in self.live_hosts()
                if (r := self.hosts.values.get(h.host_id)) is None or r.state == "up"]

    # ------------------------------------------------------------ verbs

    async def _on_place(self, req: PlaceRequest) -> Placement:
        """The least busy fitting host for a new session (`capacity.by_room`), reserved by CAS; a retry
        gets the same host while it is reserved."""
        # One placement at a time per instance, each seeing the last one's reservation (`wrote`): placed
        # concurrently from one view, a burst of sessions would all go to the host that was least busy.
        async with self._placing:
            return await self._place_one(req)

    async def _place_one(self, req: PlaceRequest) -> Placement:
        sid = req.session_id
        done = self._placed.get(sid)
        if done is not None and sid in self.hosts.values.get(done.host_id, HostRecord(host_id="")).sessions:
            return done
        self._specs[sid] = (req.contract, req.backend)
        ests = capacity.by_room(req.contract, req.backend, self.live_hosts(), self.hosts.values, req.guard,
                                 self.config.reservation_settle_s)
        for est in (e for e in ests if e.fits):
            host = self.liveness.entry(est.host_id)
            if host is None:
                continue

            def take(view: EngineEntry, record: HostRecord, host=host) -> HostRecord:
                # Decided again on the records as read now (the host's, and its device peers'): the CAS
                # makes this the decision that holds.
                fresh = capacity.fit(req.contract, req.backend, view, capacity.release(record, [sid]), req.guard,
                                     self.config.reservation_settle_s)
                if not fresh.fits:
                    raise Rejected(f"host {host.host_id}: {fresh.reason}", reason="no_fit")
                return capacity.reserve(record, sid, fresh, host.incarnation, time.time())

            try:
                record = await device_cas.reserve(self.records, host, self.live_hosts(),
                                                  self.config.reservation_settle_s, sid, take)
            except Rejected:
                continue  # filled up since the mirror showed it: the next host in order
            self.hosts.wrote(est.host_id, record)
            placement = Placement(session_id=sid, host_id=est.host_id, estimate=est, incarnation=host.incarnation)
            self._placed[sid] = placement
            self.log.info("placed", session_id=sid, host_id=est.host_id, busy_fraction=est.busy_fraction)
            return placement
        raise Rejected(f"no engine host fits session {sid}", reason="no_fit", session_id=sid,
                       hosts=",".join(f"{e.host_id}:{e.reason}" for e in ests))

    def owned(self, host_id: str) -> list[SessionSummary]:
        """Sessions the `sf_sessions` hint says `host_id` owns."""
        return [s for s in self.sessions.values.values() if s.owner_server_id == host_id and s.state != "closed"]

    def host_info(self, host_id: str, record: HostRecord | None = None) -> HostInfo:
        """The host as placement sees it; `record` is one just written (the mirror may not show it yet)."""
        entry = self.liveness.entry(host_id)
        record = record or self.hosts.values.get(host_id)
        state = "dead" if entry is None else (record.state if record else "up")
        return HostInfo(host_id=host_id, state=state,
                        incarnation=entry.incarnation if entry else (record.incarnation if record else ""),
                        sessions=len(self.owned(host_id)), reserved=len(record.sessions) if record else 0,
                        busy_fraction=entry.busy_fraction if entry else 0.0,
                        heartbeat_age_s=max(0.0, time.time() - entry.heartbeat_at) if entry else 0.0)

    async def _on_hosts(self, _: HostsRequest) -> HostList:
        ids = set(self.liveness.live) | set(self.hosts.values) | set(self.liveness.dead)
        return HostList(hosts=[self.host_info(h) for h in sorted(ids)])

    async def _on_undrain(self, req: HostRequest) -> HostInfo:
        self._known(req.host_id)
        record = await self.records.change(req.host_id, lambda r: msgspec.structs.replace(r, state="up"))
        self.log.info("host_undrained", host_id=req.host_id)
        self._wake.set()
        return self.host_info(req.host_id, record)

    def _known(self, host_id: str) -> None:
        if host_id not in self.liveness.live and host_id not in self.hosts.values:
            raise NotFound(f"no engine host {host_id}", host_id=host_id, field="host_id")


def _hinted_view(s: SessionSummary) -> SessionView:
    """The ownership the `sf_sessions` hint shows, as fence's view (enough to suspect a dead owner)."""
    return SessionView(owner=Owner(server_id=s.owner_server_id, version=s.owner_version),
                       incarnation=s.owner_incarnation, closed=s.state == "closed")
