"""The engine side of fencing: learn assignments, claim, take only our own releases, report progress.

An engine host builds one `EngineClient(nc, js, server_id)`. For each session:

    notice = await client.next_assignment()          # or iterate `client.assignments()`
    meta = await client.meta(notice.session_id)      # contract, seed, checkpoint ref + cursor
    ...install state (restore meta.checkpoint_ref, or init from seed)...
    lease = await client.claim(notice.session_id, notice.version, cursor=meta.checkpoint_cursor)
    async for item in lease:                         # items lease.cursor+1, +2, ... in log order
        apply(item); await lease.report_applied(item.seq)
    # the loop ends once a newer assign (or a close) revokes the lease: stop taking input

Claims go through fence (`sf.fence.claim`), the log's only writer. The host reads
the log through one consumer for all its sessions (`HostFeed`: every record addressed
to this host, which after a claim is every record up to the one that revokes it). A
lease takes its session's records from its claim onward and yields the items of
releases addressed to exactly its `(server_id, version)`; anything else is skipped,
and an assign to anyone else (or a close) ends it (`lease.revoked` is set).

A host that placement may have declared dead (its heartbeats stopped reaching the
bus for long enough: a stopped process, a partition) may already have been
replaced, while releases addressed to it still sit in its feed. So once the
host's heartbeats have had such a gap, every lease confirms its claim on the log
before it yields its next item, and ends if the claim is gone.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator

import structlog

from libs import bus, errors, names
from libs.fence import core, session_log
from libs.fence.host_feed import HostFeed
from libs.schemas.base import encode
from libs.schemas.common import InputItem
from libs.schemas.fence import (
    AppliedCursor,
    AssignNotice,
    CheckpointRequest,
    ClaimReply,
    ClaimRequest,
    Kick,
    KickReply,
    LogRecord,
    MetaRequest,
    Owner,
    Release,
    SessionMeta,
)
from libs.telemetry import counter

_log = structlog.get_logger("statefleet.fence.client")
_notices_failed = counter("sf_engine_assignment_notices_failed_total",
                          "Assignment notices dropped (malformed) or retried (log unreadable)")
KICK_ATTEMPTS = 20
NOTICE_RETRY_S = 0.5
CONFIRM_RETRY_S = 0.2
# How long a claim keeps retrying through a bus outage or a JetStream leader election: the
# assignment stays ours meanwhile, and giving up would leave the session claimed by nobody.
CLAIM_RETRY_S = 60.0


class EngineClient:
    """`incarnation`: this process of `server_id` (claims carry it; assigns naming another are not ours).
    `suspect_after_s`: a heartbeat gap this long means placement may have declared us dead (0: never)."""

    def __init__(self, nc: bus.Client, js: bus.JetStream, server_id: str, *, incarnation: str = "",
                 suspect_after_s: float = 0.0) -> None:
        self.nc, self.js, self.server_id = nc, js, server_id
        self.incarnation = incarnation
        self.suspect_after_s = suspect_after_s
        self._notices: asyncio.Queue[AssignNotice] = asyncio.Queue()
        self._sub: bus.Subscription | None = None
        self._leases: dict[str, Lease] = {}
        self._feed: HostFeed | None = None
        self._feed_lock = asyncio.Lock()
        self._claiming: dict[str, dict[str, list[tuple[int, LogRecord]]]] = {}  # sid -> claim_id -> held records
        self._meta_kv: bus.KeyValue | None = None
        self._last_beat: float | None = None  # monotonic time the host's last heartbeat landed
        self._epoch = 0  # bumped by every heartbeat gap long enough to have been declared dead

    def heartbeat_landed(self, at: float) -> None:
        """The host's heartbeat reached the bus at monotonic `at`."""
        if self._last_beat is not None and self.suspect_after_s and at - self._last_beat > self.suspect_after_s:
            self._epoch += 1
        self._last_beat = at

    def trusted_epoch(self) -> int | None:
        """The liveness epoch while our heartbeats are beyond doubt; None while they may have lapsed."""
        if self.suspect_after_s and self._last_beat is not None \
                and time.monotonic() - self._last_beat > self.suspect_after_s:
            return None
        return self._epoch

    async def start(self) -> None:
        """Listen for assignments addressed to this server (a hint; each is checked against the log)."""
        self._sub = await bus.subscribe_events(self.nc, names.assigned_subject(self.server_id), AssignNotice,
                                               self._on_notice)

    async def close(self) -> None:
        if self._sub is not None:
            await bus.quietly(self._sub.unsubscribe())
        for lease in list(self._leases.values()):
            await lease.stop()
        if self._feed is not None:
            await self._feed.stop()

    async def _on_notice(self, notice: AssignNotice) -> None:
        await self._notices.put(notice)

    async def next_assignment(self) -> AssignNotice:
        """The next assignment to this server that the log still shows as the latest.

        Never raises for one notice: a malformed one is dropped, one whose log cannot be read now
        (a timeout, an outage) is retried after a pause, each counted, so the watcher that takes
        assignments outlives any single one (a host that heartbeats must be able to claim)."""
        while True:
            notice = await self._notices.get()
            try:
                session_log.check_session_id(notice.session_id)
                tail = await session_log.read_tail(self.js, notice.session_id)
            except errors.BadRequest as e:  # malformed (bad id, undecodable log record): nothing to claim
                _notices_failed.add(1, {"reason": e.code})
                _log.warning("assignment_notice_dropped", session_id=notice.session_id[:140], detail=e.detail)
                continue
            except errors.StatefleetError as e:
                _notices_failed.add(1, {"reason": e.code})
                _log.warning("assignment_notice_retry", session_id=notice.session_id, error=repr(e))
                await asyncio.sleep(NOTICE_RETRY_S)
                self._notices.put_nowait(notice)
                continue
            view = tail.view
            if view.owner == Owner(server_id=self.server_id, version=notice.version) \
                    and view.incarnation in ("", self.incarnation):
                return notice

    async def assignments(self) -> AsyncIterator[AssignNotice]:
        while True:
            yield await self.next_assignment()

    async def meta(self, session_id: str, *, init_media: bool = False) -> SessionMeta:
        """The session's metadata; with `init_media`, its init image and audio too (to start it)."""
        return await bus.request(self.nc, names.FENCE_META, MetaRequest(session_id=session_id, init_media=init_media),
                                 SessionMeta)

    async def claim(self, session_id: str, version: int, cursor: int) -> Lease:
        """Ask fence to claim `(self, version)` with installed state reflecting item `cursor`; start the lease.

        Raises `Conflict` if the assignment is stale, not ours, or already claimed. An unanswered request
        (fence restarting, a JetStream leader election) is asked again, with the same `claim_id`, until
        `CLAIM_RETRY_S`: fence answers a repeat whose claim landed with that claim, so asking twice never
        claims twice.
        """
        session_log.check_session_id(session_id)
        me = Owner(server_id=self.server_id, version=version)
        deadline = time.monotonic() + CLAIM_RETRY_S
        request = ClaimRequest(session_id=session_id, server_id=self.server_id, version=version, cursor=cursor,
                               incarnation=self.incarnation, claim_id=secrets.token_hex(8))
        await self._start_feed(deadline)
        # Records of this session the feed delivers while the claim is asked (fence's gateway may release
        # right after the claim lands, before its answer): held for the lease the answer creates.
        held: list[tuple[int, LogRecord]] = []
        self._claiming.setdefault(session_id, {})[request.claim_id] = held
        try:
            reply = await _retrying(lambda: bus.request(self.nc, names.FENCE_CLAIM, request, ClaimReply),
                                    deadline, session_id)
            old = self._leases.pop(session_id, None)
            if old is not None:
                await old.stop()
        finally:
            claims = self._claiming[session_id]
            del claims[request.claim_id]
            if not claims:
                del self._claiming[session_id]
        # No await from here until the lease is registered: the feed would deliver to nobody.
        lease = Lease(self, session_id, me, cursor, reply.log_seq)
        self._leases[session_id] = lease
        for position, record in held:
            lease.on_record(position, record)
        lease.start()
        _log.info("claimed", session_id=session_id, server_id=self.server_id, version=version, cursor=cursor)
        return lease

    async def _start_feed(self, deadline: float) -> None:
        """The host's one consumer for all its leases, started before its first claim (so it reads from
        before that claim's position) and retried through an outage until `deadline`."""
        async with self._feed_lock:
            if self._feed is None:
                feed = HostFeed(self.js, self.server_id, self._on_record)
                await _retrying(feed.start, deadline, "")
                self._feed = feed

    def _on_record(self, session_id: str, position: int, record: LogRecord) -> None:
        for held in self._claiming.get(session_id, {}).values():
            held.append((position, record))
        lease = self._leases.get(session_id)
        if lease is not None:
            lease.on_record(position, record)

    async def checkpoint(self, session_id: str, version: int, ref: str, cursor: int, block: int = 0) -> SessionMeta:
        """Record a new checkpoint of the session at `block`, reflecting item `cursor` (only the claimed
        owner may; neither goes back)."""
        req = CheckpointRequest(session_id=session_id, server_id=self.server_id, version=version,
                                ref=ref, cursor=cursor, block=block)
        return await bus.request(self.nc, names.FENCE_CHECKPOINT, req, SessionMeta)

    async def meta_kv(self) -> bus.KeyValue:
        if self._meta_kv is None:
            self._meta_kv = await self.js.key_value(names.FENCE_META_BUCKET)
        return self._meta_kv

    def lease(self, session_id: str) -> Lease | None:
        return self._leases.get(session_id)


class Lease:
    """One claimed incarnation `(server_id, version)` of a session: its in-order input, until revoked."""

    def __init__(self, client: EngineClient, session_id: str, owner: Owner, cursor: int, read_after: int):
        self.client = client
        self.session_id = session_id
        self.owner = owner
        self.cursor = cursor  # the item seq the installed state reflects; input resumes after it
        self.applied = cursor
        # A log position at or before the claim (0: unknown): the lease reads after it.
        self.read_after = read_after
        self.revoked = asyncio.Event()
        self._epoch = client.trusted_epoch()  # the liveness epoch the claim was last confirmed in
        self._items: asyncio.Queue[InputItem | None] = asyncio.Queue()
        self._next = cursor + 1
        self._seen = read_after  # the last log position read: a restarted feed may deliver it again
        self._kicker: asyncio.Task | None = None

    def start(self) -> None:
        """Ask a gateway to release what waited for the claim (the host's feed brings the records)."""
        self._kicker = asyncio.create_task(self._kick())

    async def stop(self) -> None:
        """Take no more records; the iterator ends after what it holds."""
        self._detach()

    def _detach(self) -> None:
        if self._kicker is not None:
            self._kicker.cancel()
        if self.client._leases.get(self.session_id) is self:
            del self.client._leases[self.session_id]
        self._end()

    def _end(self) -> None:
        if not self.revoked.is_set():
            self.revoked.set()
            self._items.put_nowait(None)

    async def _kick(self) -> None:
        """Ask a gateway to release what waited for this claim; retried until one answers."""
        for attempt in range(KICK_ATTEMPTS):
            try:
                await bus.request(self.client.nc, names.FENCE_KICK, Kick(session_id=self.session_id),
                                  KickReply, timeout_s=5.0)
                return
            except errors.StatefleetError as e:
                _log.warning("kick_retry", session_id=self.session_id, error=repr(e))
                await asyncio.sleep(min(0.05 * 2**attempt, 2.0))
        _log.warning("kick_unanswered", session_id=self.session_id)

    def on_record(self, position: int, record: LogRecord) -> None:
        """A record of this session's log addressed to our host, at log `position` (in log order)."""
        if self.revoked.is_set():
            return
        # A feed that restarts delivers again from after the last record it delivered, or from further
        # back: never read history twice or before the claim, where older owners would look like a
        # revocation.
        if position <= self._seen:
            return
        self._seen = position
        if core.before(self.owner, record.view):
            return  # a record from before our assign (read from an unknown claim position): history
        event = record.event
        if isinstance(event, Release) and core.accepts(self.owner, event):
            for item in event.items:
                if item.seq != self._next:
                    # Cannot happen with the core's ordering rule; refuse rather than apply out of order.
                    _log.error("release_out_of_order", session_id=self.session_id, seq=item.seq,
                               expected=self._next)
                    self._end()
                    return
                self._next += 1
                self._items.put_nowait(item)
        if core.revoked(self.owner, record.view):
            self._detach()  # nothing more can be addressed to this incarnation

    def __aiter__(self) -> AsyncIterator[InputItem]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[InputItem]:
        while True:
            item = await self._items.get()
            if item is None or not await self._confirmed():
                return
            yield item

    async def _confirmed(self) -> bool:
        """Whether the claim still stands; read from the log when our liveness was in doubt since it was
        last confirmed (we may have been replaced meanwhile)."""
        epoch = self.client.trusted_epoch()
        if epoch is not None and epoch == self._epoch:
            return True
        while True:
            try:
                tail = await session_log.read_tail(self.client.js, self.session_id)
                break
            except errors.StatefleetError as e:  # cannot confirm: apply nothing until we can
                _log.warning("claim_unconfirmed", session_id=self.session_id, error=e.detail)
                await asyncio.sleep(CONFIRM_RETRY_S)
        if not core.authorized(self.owner, tail.view):
            _log.warning("claim_lost_while_unresponsive", session_id=self.session_id, server_id=self.owner.server_id,
                         version=self.owner.version)
            await self.stop()
            return False
        self._epoch = self.client._epoch if epoch is None else epoch
        return True

    @property
    def backlog(self) -> int:
        """Items released to this lease and not yet taken by its reader."""
        return self._items.qsize()

    async def report_applied(self, cursor: int) -> None:
        """The engine's state now reflects every item up to `cursor` (kept in the meta bucket as a hint)."""
        if cursor < self.applied:
            raise errors.BadRequest(f"applied cursor went back from {self.applied} to {cursor}",
                                    session_id=self.session_id)
        self.applied = cursor
        # A hint: while a JetStream leader is elected the put goes unanswered, and the caller must be
        # able to treat that as the typed, retryable error it is rather than lose its input loop.
        with bus.unavailable("applied cursor not recorded", session_id=self.session_id):
            kv = await self.client.meta_kv()
            await kv.put(names.applied_key(self.session_id), encode(AppliedCursor(
                server_id=self.owner.server_id, version=self.owner.version, cursor=cursor)))



async def _retrying(attempt, deadline: float, session_id: str):
    """`await attempt()`, retried through transient bus failures while `deadline` allows."""
    return await bus.retry_transient(attempt, deadline, lambda e: _log.warning(
        "fence_unavailable_retry", session_id=session_id, detail=e.detail))
