"""The admission service process: the session API over HTTP around the pure admission core.

Every session admission knows is a `SessionRecord` in the `sf_admission` KV bucket,
written before the client hears the outcome; the in-memory queue and reservations
are a cache rebuilt from those records when an instance starts. One instance owns
the queue at a time (the queue's FIFO order is per instance).

Create: decide (core) → if admitted, ask placement for a host (`sf.placement.place`)
→ record `placed` with the host and demand. A candidate that does not fit now, or
that placement could not place, is recorded `queued` and placed later by the queue
loop (`_place_queued_loop`), which wakes on every engine heartbeat change, on deletes and on deadlines.

Fence is the authority for who serves a session. Every session that is not
rejected is registered with fence at create (fence issues its input token, shown
once in the create reply), and placing it ends with fence's `assign` to the
chosen host, which then restores or initialises the state and claims. Delete
closes the session at fence (ingress stops, the owner's lease is revoked and it
shuts the session down in order) before the record goes.
"""

from __future__ import annotations

import asyncio
import functools
import time
import uuid
from collections import Counter
from typing import Annotated

import msgspec
from opentelemetry import trace

from libs import bus, http_limits, init_inputs, names
from libs.config import HttpServerConfig, PositiveFloat, PositiveInt, section
from libs.contracts import Demand, Guard
from libs.errors import Busy, Conflict, NotFound, Rejected, StatefleetError, Timeout, TooLarge, Unavailable
from libs.fence.ownership import assign, read_owner
from libs.http_limits import HttpLimits
from libs.live_hosts import LiveHosts
from libs.schemas.admission import (
    AdmissionVerdict,
    CreatedSession,
    CreateSession,
    FleetView,
    QueueEntry,
    QueueView,
    SessionRecord,
    SessionStatus,
)
from libs.schemas.base import decode, encode
from libs.schemas.common import EngineEntry
from libs.schemas.fence import CloseReply, CloseRequest, RegisterReply, RegisterRequest
from libs.schemas.motion import MoveReceipt, MoveRequest
from libs.schemas.placement import (
    DrainReport,
    HostInfo,
    HostList,
    HostRequest,
    HostsRequest,
    Placement,
    PlaceRequest,
)
from libs.service import Service
from libs.tasks import wait_set
from libs.telemetry import counter, histogram, traced
from libs.ws_limits import SocketGate, SocketLimits
from services.admission import http, media_rate, views
from services.admission.auth import OPEN, Caller, Credentials
from services.admission.console import add_console
from services.admission.core import AdmissionCore, Candidate, Policy
from services.admission.fleet_feed import FleetFeed
from services.admission.ramp import Ramp

_verdicts = counter("sf_admission_verdicts_total", "Admission verdicts by outcome and reason")
_queue_wait = histogram("sf_admission_queue_wait", "Created to placed, for sessions that waited", unit="s")


class AdmissionConfig(HttpServerConfig, kw_only=True):
    http_host: str = "127.0.0.1"
    http_port: Annotated[int, msgspec.Meta(ge=0, le=65535)] = 8700
    admin_token: str = ""  # bearer token for /v1/admin/* and every session; empty disables the admin routes
    # tenant → API key; with a key or the admin token configured, the session routes need one (auth.py)
    api_keys: dict[str, str] = {}
    max_sessions_per_tenant: Annotated[int, msgspec.Meta(ge=0)] = 0  # live sessions a tenant may hold; 0 = no quota
    max_prompt_bytes: PositiveInt = 16384
    guard_busy_fraction: Annotated[float, msgspec.Meta(ge=0, lt=1)] = 0.1
    guard_memory_fraction: Annotated[float, msgspec.Meta(ge=0, lt=1)] = 0.05
    max_sessions_per_host: PositiveInt = 64
    queue_capacity: Annotated[int, msgspec.Meta(ge=0)] = 256
    queue_timeout_s: PositiveFloat = 30.0
    # A device takes this many sessions at start-up's prices, then at most ramp_growth more than its hosts
    # measured themselves serving (at least one): services/admission/ramp.py
    ramp_initial_sessions: PositiveInt = 4
    ramp_growth: PositiveFloat = 0.25
    # A placement counts against its host until its heartbeat lists the session; one that never
    # arrives stops counting after this (libs/contracts.py `unsettled`).
    reservation_settle_s: PositiveFloat = 30.0
    place_timeout_s: PositiveFloat = 2.0
    engine_watch_silence_s: PositiveFloat = 5.0  # re-open the sf_engines watch after this long without news
    fence_timeout_s: PositiveFloat = 2.0
    drain_timeout_s: PositiveFloat = 300.0  # a drain answers once every session is off the host
    # Where clients reach fence's ingress (input and output); `statefleet up` sets it to fence's port.
    ingress_url: str = "http://127.0.0.1:8701"


class AdmissionService(Service):
    name = "admission"
    config_type = AdmissionConfig

    async def setup(self) -> None:
        cfg = self.config
        self.guard = Guard(busy_fraction=cfg.guard_busy_fraction, memory_fraction=cfg.guard_memory_fraction,
                           max_sessions=cfg.max_sessions_per_host)
        self.core = AdmissionCore(Policy(guard=self.guard, queue_capacity=cfg.queue_capacity,
                                         queue_timeout_s=cfg.queue_timeout_s, settle_s=cfg.reservation_settle_s,
                                         ramp=Ramp(initial=cfg.ramp_initial_sessions, growth=cfg.ramp_growth)))
        self._lock = asyncio.Lock()  # one decision at a time: decide, place, record
        self._tenants: Counter[str] = Counter()  # live (not timed-out) sessions per tenant, for the quota
        self._wake = asyncio.Event()
        self.records = await bus.ensure_kv(self.js, names.ADMISSION_BUCKET, replicas=cfg.nats_replicas)
        self.hosts = await LiveHosts.open(self.js, heartbeat_s=cfg.heartbeat_s, replicas=cfg.nats_replicas,
                                          log=self.log)
        await self.hosts.watch()
        await self._recover()
        self.spawn(self.hosts.follow(self._wake.set, cfg.engine_watch_silence_s), "watch_engines")
        self.spawn(self._place_queued_loop(), "place_queued")
        self.feed = FleetFeed(self.nc, self.js, queue=self.queue_view, heartbeat_s=cfg.heartbeat_s)
        await self.feed.start(self.spawn)
        app = http.make_app(self, Credentials(cfg.admin_token, cfg.api_keys))
        add_console(app, feed=self.feed, admin_token=cfg.admin_token, move=self.move, ingress_url=cfg.ingress_url,
                    sockets=SocketGate(section(cfg, "ws_", SocketLimits)))
        self._runner, self.http_port, self.http_guard = await http_limits.serve(
            app, cfg.http_host, cfg.http_port, section(cfg, "http_", HttpLimits), "admission")
        self.log.info("http_listening", host=cfg.http_host, port=self.http_port)

    async def teardown(self) -> None:
        self.feed.stop()
        await self._runner.cleanup()

    # ------------------------------------------------------------ the session API (called by http)

    async def create(self, req: CreateSession, caller: Caller = OPEN) -> tuple[int, CreatedSession]:
        """Admit and place, or queue; 201 with the placed session, 202 with the queued one."""
        if len(req.prompt.encode()) > self.config.max_prompt_bytes:
            raise TooLarge(f"prompt is over {self.config.max_prompt_bytes} bytes", field="prompt",
                           limit=self.config.max_prompt_bytes)
        kinds, max_bytes = init_inputs.limits_on(req.backend, self._live())
        init_inputs.check(req.prompt, req.image, req.audio, kinds=kinds, max_bytes=max_bytes, backend=req.backend)
        contract = media_rate.complete(req.contract, req.backend, [r for h in self._live() for r in h.profile])
        req = msgspec.structs.replace(req, contract=contract)
        cand = Candidate(session_id=uuid.uuid4().hex, backend=req.backend, contract=req.contract)
        return await traced("admission.create", functools.partial(self._create, req=req, caller=caller))(cand)

    async def _create(self, cand: Candidate, req: CreateSession, caller: Caller) -> tuple[int, CreatedSession]:
        async with self._lock:
            self._check_quota(caller)
            now = time.time()
            verdict = self.core.submit(cand, self._live(), now)
            _verdicts.add(1, {"outcome": verdict.outcome, "reason": verdict.reason})
            trace.get_current_span().set_attribute("verdict", verdict.outcome)
            if verdict.outcome == "rejected":
                raise _rejection(verdict)
            try:
                token = await self._register(cand.session_id, req)
            except StatefleetError:
                self.core.forget(cand.session_id)  # not registered, so not queued either
                raise
            record = SessionRecord(session_id=cand.session_id, backend=req.backend, contract=req.contract,
                                   seed=req.seed, prompt=req.prompt, state="queued", verdict=verdict,
                                   created_at=now, updated_at=now, queue_deadline=verdict.queue_deadline,
                                   tenant=caller.tenant)
            self._tenants[caller.tenant] += 1  # counted from here: every way out below forgets it again
            if verdict.outcome == "admitted":
                placed = await self._place(record, verdict, create=True)
                if placed is not None:
                    return 201, await self._created(placed, token)
                verdict = self.core.enqueue(cand, now, estimates=verdict.estimates)
                record = msgspec.structs.replace(record, verdict=verdict, queue_deadline=verdict.queue_deadline)
            try:
                await self._kv(self.records.create(cand.session_id, encode(record)))
            except StatefleetError:
                self.core.forget(cand.session_id)  # nothing recorded, so nothing queued
                self._tenants[caller.tenant] -= 1
                await self._close_at_fence(cand.session_id, "admission record not written")
                raise
        return 202, await self._created(record, token)

    async def _register(self, session_id: str, req: CreateSession) -> str:
        """Register with fence (shared metadata for any server that will run it); returns the input token."""
        rows = [r for h in self._live() for r in h.profile if r.backend == req.backend]
        reg = RegisterRequest(session_id=session_id, backend=req.backend, seed=req.seed, prompt=req.prompt,
                              image=req.image, audio=req.audio,
                              contract=encode(req.contract), tier=req.contract.quality_floor,
                              input_kinds=rows[0].input_kinds if rows else [],
                              max_input_bytes=min(r.max_input_bytes for r in rows) if rows else 0)
        reply = await bus.request(self.nc, names.FENCE_REGISTER, reg, RegisterReply,
                                  timeout_s=self.config.fence_timeout_s)
        return reply.token  # fence wrote the session's first summary (backend, class) as it registered it

    async def _close_at_fence(self, session_id: str, reason: str) -> None:
        try:
            await bus.request(self.nc, names.FENCE_CLOSE, CloseRequest(session_id=session_id, reason=reason),
                              CloseReply, timeout_s=self.config.fence_timeout_s)
        except NotFound:
            pass  # never registered (or already gone): nothing to close

    async def _created(self, record: SessionRecord, token: str) -> CreatedSession:
        view = await self._owned_view(record)
        base = f"{self.config.ingress_url.rstrip('/')}/v1/sessions/{record.session_id}"
        ws = "ws" + base.removeprefix("http")
        return CreatedSession(**msgspec.structs.asdict(view), input_token=token, input_url=f"{base}/items",
                              input_ws_url=f"{ws}/ws", output_ws_url=f"{ws}/output")

    async def get(self, session_id: str, caller: Caller = OPEN) -> SessionStatus:
        return await self._owned_view(await self._load(session_id, caller))

    async def delete(self, session_id: str, caller: Caller = OPEN) -> None:
        async with self._lock:
            record = await self._load(session_id, caller)
            await self._close_at_fence(session_id, "deleted")
            await self._kv(self.records.delete(session_id))
            self.core.forget(session_id)
            if record.state != "timed_out":  # a timed-out session stopped counting when it timed out
                self._tenants[record.tenant] -= 1
        self._wake.set()

    def _check_quota(self, caller: Caller) -> None:
        quota = self.config.max_sessions_per_tenant
        if quota and not caller.admin and self._tenants[caller.tenant] >= quota:
            raise Busy(f"tenant {caller.tenant} holds its quota of {quota} sessions; delete one first",
                       reason="tenant_quota", limit=quota)

    def queue_view(self) -> QueueView:
        return QueueView(capacity=self.config.queue_capacity, timeout_s=self.config.queue_timeout_s,
                         entries=[QueueEntry(session_id=w.candidate.session_id, position=i,
                                             enqueued_at=w.enqueued_at, deadline=w.deadline)
                                  for i, w in enumerate(self.core.waiting(), 1)])

    def fleet_view(self) -> FleetView:
        return views.fleet(self._live(), self.core.reservations)

    async def move(self, session_id: str, dest: str, deadline_s: float) -> MoveReceipt:
        """An operator's move (the dashboard's): from the session's owner to `dest`, through the mover."""
        owner = (await read_owner(self.js, session_id)).view.owner
        if owner is None:
            raise NotFound(f"session {session_id} has no owner to move from", session_id=session_id)
        req = MoveRequest(session_id=session_id, source=owner.server_id, dest=dest, deadline_s=deadline_s)
        return await bus.request(self.nc, names.MOVER_MOVE, req, MoveReceipt, timeout_s=deadline_s + 30)

    # ------------------------------------------------------------ placing and recording

    async def _place(self, record: SessionRecord, verdict: AdmissionVerdict, *, create: bool) -> SessionRecord | None:
        """Ask placement for a host and record the decision; None when it could not be placed now."""
        sid = record.session_id
        hosts = self.core.ramp_hosts(Candidate(sid, record.backend, record.contract), self._live())
        if hosts == []:  # a heartbeat since the verdict: no device's ramp takes it now, so it waits queued
            return None
        req = PlaceRequest(session_id=sid, backend=record.backend, contract=record.contract, guard=self.guard,
                           hosts=hosts or [])
        try:
            placement = await bus.request(self.nc, names.PLACEMENT_PLACE, req, Placement,
                                          timeout_s=self.config.place_timeout_s)
            # The host learns of the session from this assignment; it claims once its state is up.
            await assign(self.nc, sid, placement.host_id, incarnation=placement.incarnation)
        except (Rejected, Unavailable, Timeout, Conflict) as e:
            self.log.info("placement_deferred", session_id=sid, code=e.code, detail=e.detail)
            return None
        now = time.time()
        need = Demand(busy_fraction=placement.estimate.busy_fraction, state_bytes=placement.estimate.state_bytes)
        placed = msgspec.structs.replace(record, state="placed", verdict=verdict, host_id=placement.host_id,
                                         placed_at=now, demand=need, updated_at=now, queue_deadline=0.0)
        write = self.records.create if create else self.records.put
        await self._kv(write(sid, encode(placed)))
        self.core.placed(sid, placement.host_id, need, now)
        _queue_wait.record(now - record.created_at, {"class": record.contract.session_class})
        self.log.info("session_placed", session_id=sid, host_id=placement.host_id, tier=placement.estimate.tier)
        return placed

    async def _place_queued_loop(self) -> None:
        while True:
            deadline = self.core.next_deadline()
            wait_s = 1.0 if deadline is None else min(1.0, max(0.0, deadline - time.time()))
            await wait_set(self._wake, wait_s)
            self._wake.clear()
            try:
                await self._place_queued()
            except StatefleetError as e:  # NATS down: the queue is intact, try again on the next wake
                self.log.warning("place_queued_failed", code=e.code, detail=e.detail)

    async def _place_queued(self) -> None:
        """Time out expired waiters, then place from the head while the head fits."""
        async with self._lock:
            for cand, verdict in self.core.expire(time.time()):
                _verdicts.add(1, {"outcome": verdict.outcome, "reason": verdict.reason})
                try:
                    record = await self._load(cand.session_id)
                except NotFound:
                    continue
                await self._kv(self.records.put(cand.session_id, encode(msgspec.structs.replace(
                    record, state="timed_out", verdict=verdict, updated_at=time.time()))))
                self._tenants[record.tenant] -= 1
                # Its input token stops working with it: nothing will ever serve that input.
                await self._close_at_fence(cand.session_id, "queue_timeout")
            while (ready := self.core.head_ready(self._live())) is not None:
                cand, verdict = ready
                try:
                    record = await self._load(cand.session_id)
                except NotFound:  # its record was removed behind our back: nothing left to place
                    self.core.forget(cand.session_id)
                    continue
                _verdicts.add(1, {"outcome": verdict.outcome, "reason": verdict.reason})
                if await self._place(record, verdict, create=False) is None:
                    return

    async def _recover(self) -> None:
        """Rebuild the queue (in creation order, with the original deadlines) and reservations."""
        entries = await bus.kv_entries(self.records)
        records = sorted([await self._load(e.key) for e in entries], key=lambda r: (r.created_at, r.session_id))
        for r in records:
            if r.state != "timed_out":
                self._tenants[r.tenant] += 1
            if r.state == "placed" and r.demand is not None:
                self.core.placed(r.session_id, r.host_id, r.demand, r.placed_at)
            elif r.state == "queued":
                cand = Candidate(session_id=r.session_id, backend=r.backend, contract=r.contract)
                self.core.enqueue(cand, r.created_at, deadline=r.queue_deadline)
        self.log.info("recovered", sessions=len(records), queued=len(self.core.waiting()))

    async def _load(self, session_id: str, caller: Caller = OPEN) -> SessionRecord:
        """The record; another tenant's session is as not found as a missing one (no oracle)."""
        entry = await bus.kv_read(self.records, session_id)
        if entry is None:
            raise NotFound(f"no session {session_id}", field="session_id", session_id=session_id)
        record = decode(entry.value or b"", SessionRecord)
        if not caller.may_touch(record.tenant):
            raise NotFound(f"no session {session_id}", field="session_id", session_id=session_id)
        return record

    async def _kv(self, op):
        """Await a write to the records; a bus that does not answer is `Unavailable` (retryable), not a crash."""
        with bus.unavailable("the session store did not answer"):
            return await op

    # ------------------------------------------------------------ engine hosts

    def _live(self) -> list[EngineEntry]:
        return self.hosts.followed()

    async def _owned_view(self, r: SessionRecord) -> SessionStatus:
        position = self.core.position(r.session_id) if r.state == "queued" else 0
        return await views.owned_status(self.js, r, position, self._live(), self.log)

    # ------------------------------------------------------------ host lifecycle (admin; placement decides)

    async def host_list(self) -> HostList:
        return await bus.request(self.nc, names.PLACEMENT_HOSTS, HostsRequest(), HostList,
                                 timeout_s=self.config.place_timeout_s)

    async def drain_host(self, host_id: str) -> DrainReport:
        return await bus.request(self.nc, names.PLACEMENT_DRAIN, HostRequest(host_id=host_id), DrainReport,
                                 timeout_s=self.config.drain_timeout_s)

    async def undrain_host(self, host_id: str) -> HostInfo:
        return await bus.request(self.nc, names.PLACEMENT_UNDRAIN, HostRequest(host_id=host_id), HostInfo,
                                 timeout_s=self.config.place_timeout_s)

def _rejection(verdict: AdmissionVerdict) -> StatefleetError:
    """The error a rejected create answers with; it carries the verdict (and its estimates) to the client."""
    if verdict.reason == "queue_full":
        return Busy(verdict.detail, reason=verdict.reason, verdict=verdict)
    fields = verdict.fields or ["contract"]  # never_fits: the contract as a whole asks too much
    return Rejected(verdict.detail, reason=verdict.reason, field=fields[0], fields=",".join(fields),
                    verdict=verdict)
