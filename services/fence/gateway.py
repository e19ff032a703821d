"""The gateway: releases each session's stored input, in seq order, to its current claimed owner.

Work arrives three ways: items this instance's ingress has just stored (`offer`, so
an item does not wait for the consumer's round trip), a durable pull consumer on the
input stream, shared by every gateway instance (so a crashed instance's items are
delivered to another), and `names.FENCE_KICK` requests (queue group) after a claim.
Every way the work is
`pump(session)`: decide on the cached log tail, append the release with a
compare-and-set on that tail, and on a lost race re-read the tail and decide
again. That CAS is the re-check of server id *and* version before every release:
an assign or claim landing in between moves the log, so the stale append fails.

While a session is unclaimed its items simply stay in the input stream (acked
from the consumer: the claim's kick releases them); ingress bounds how many wait.

The owner's queue is bounded too: at most `max_unapplied` items are released beyond
the owner's applied cursor (`<sid>.applied`, which its engine reports as it takes
items). An engine that cannot keep up is released no more; its items wait, stored,
in the input stream, until its cursor advances (the gateway hears every cursor put),
and ingress answers 429 once `max_pending_items` wait: backpressure from the engine
to the client, and nothing accepted is dropped.

A `clear` overtakes that bound: with a clear in hand, the owner is released every item up to
it at once, whatever its cursor, so the clear reaches the engine within a block period however
much audio waits (the backend drops the audio before the clear unplayed, in the block that
applies it). The release is an ordinary one, in seq order and CAS'd like every other.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict

import structlog

from libs import bus, errors, names
from libs.fence import core, session_log
from libs.schemas.base import decode
from libs.schemas.common import InputItem
from libs.schemas.fence import AppliedCursor, InputBatch, Kick, KickReply
from libs.tasks import STOP_TIMEOUT_S, cancel_and_wait
from libs.telemetry import counter
from services.fence import input_reads

CONSUMER = "fence-gateway"
# A crashed instance's unacked items go to another after this; a redelivered item is harmless (the
# pump finds it released and acks it), and any later item or claim for the session releases it sooner.
ACK_WAIT_S = 5.0
# How long the consumer waits before its next fetch when it fetched less than a full batch (no backlog).
# Only items whose storing instance died before releasing them wait this long (plus ACK_WAIT_S if unacked).
NET_PAUSE_S = 0.05
HELD_RETRY_S = 1.0  # sessions held for their owner's cursor are looked at again this often
KICK_CONCURRENCY = 64
_released = counter("sf_fence_released_items_total", "Items released to a claimed owner")
_cas_lost = counter("sf_fence_release_cas_lost_total", "Release appends refused because the log moved")
_malformed = counter("sf_fence_input_batches_malformed_total", "Input-stream messages the gateway skipped")
_held = counter("sf_fence_release_held_total",
                "Times a session's releases were held back because its owner had max_unapplied items queued")
_consume_failed = counter("sf_fence_gateway_handle_failed_total", "Fetched batches the gateway failed to handle")


class Gateway:
    def __init__(self, nc: bus.Client, js: bus.JetStream, *, batch: int, max_release_items: int,
                 max_release_bytes: int, max_unapplied: int = 1 << 30) -> None:
        self.nc, self.js = nc, js
        self.max_unapplied = max_unapplied
        self._applied: dict[str, AppliedCursor] = {}  # each session owner's applied cursor: a hint
        self._held: set[str] = set()  # sessions with items held back until their owner catches up
        self._repumps: dict[str, asyncio.Task] = {}
        self.batch = batch
        self.max_release_items = max_release_items
        self.max_release_bytes = max_release_bytes
        self.tails: dict[str, session_log.Tail] = {}  # a cache of each session's log tail: a hint
        self._locks: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        self._offered: dict[str, list[tuple[InputItem, int]]] = {}
        self._offer_tasks: dict[str, asyncio.Task] = {}
        self.log = structlog.get_logger("statefleet.fence.gateway")

    async def start(self, spawn) -> None:
        config = bus.ConsumerConfig(durable_name=CONSUMER, ack_policy=bus.AckPolicy.EXPLICIT,
                                    ack_wait=ACK_WAIT_S, max_ack_pending=-1, filter_subject=names.INPUT_SUBJECTS)
        self._sub = await self.js.pull_subscribe(names.INPUT_SUBJECTS, durable=CONSUMER, stream=names.INPUT_STREAM,
                                                 config=config)
        # Kicks of different sessions pump independently (each under its session's lock): a host claiming
        # many sessions at once must not wait for them one after another.
        await bus.serve(self.nc, names.FENCE_KICK, Kick, self._on_kick, queue="fence", concurrency=KICK_CONCURRENCY)
        await self.nc.subscribe(names.APPLIED_SUBJECTS, cb=self._on_applied)
        self._task = spawn(self._consume(), "gateway")
        spawn(self._retry_held(), "gateway-held")

    async def stop(self) -> None:
        """Stop fetching; unacked items go back to the shared consumer for another instance."""
        tasks = [self._task, *self._offer_tasks.values(), *self._repumps.values()]
        # cancelled again until they end: a fetch can lose one cancellation in nats-py (libs/tasks.py)
        await cancel_and_wait(tasks, timeout_s=STOP_TIMEOUT_S)
        with contextlib.suppress(Exception):
            await self._sub.unsubscribe()

    def offer(self, session_id: str, items: list[InputItem], stream_seq: int) -> None:
        """Items just stored by this instance: release them now. Only a shortcut: if it fails, the
        consumer delivers the same items."""
        self._offered.setdefault(session_id, []).extend((item, stream_seq) for item in items)
        if session_id not in self._offer_tasks:
            self._offer_tasks[session_id] = asyncio.create_task(self._release_offered(session_id),
                                                                name=f"gateway-offer-{session_id}")

    async def _release_offered(self, session_id: str) -> None:
        try:
            while offered := self._offered.pop(session_id, None):
                try:
                    await self.pump(session_id, offered)
                except Exception as e:
                    self.log.info("offer_pump_failed", session_id=session_id, error=repr(e))
        finally:
            del self._offer_tasks[session_id]

    async def _on_applied(self, msg) -> None:
        """An owner reported its applied cursor: release what was held back for it."""
        try:
            cursor = decode(msg.data, AppliedCursor)
        except errors.StatefleetError:
            return
        session_id = names.applied_session_id(msg.subject)
        self._applied[session_id] = cursor
        if session_id in self._held:
            self._repump(session_id)

    async def _retry_held(self) -> None:
        """The net under `_on_applied` (a put made while this instance was away is not heard)."""
        while True:
            await asyncio.sleep(HELD_RETRY_S)
            for session_id in list(self._held):
                self._applied.pop(session_id, None)  # read the cursor afresh
                self._repump(session_id)

    def _repump(self, session_id: str) -> None:
        """Release what is held for the session, as a kick would (one pump at a time per session)."""
        self._held.discard(session_id)
        if session_id in self._repumps:
            return

        async def run() -> None:
            try:
                await self.pump(session_id)
            except Exception as e:  # the net (`_retry_held`) or the next cursor put tries again
                self._held.add(session_id)
                self.log.info("held_pump_failed", session_id=session_id, error=repr(e))
            finally:
                del self._repumps[session_id]

        self._repumps[session_id] = asyncio.create_task(run(), name=f"gateway-held-{session_id}")

    async def _credit(self, session_id: str, owner, tail: session_log.Tail) -> int:
        """How many more items the claimed owner may be released now (its queue's free room)."""
        cursor = self._applied.get(session_id)
        if cursor is None or (cursor.server_id, cursor.version) != (owner.server_id, owner.version):
            with contextlib.suppress(errors.StatefleetError):  # none recorded, or unread now: a hint
                kv = await bus.bucket(self.js, names.FENCE_META_BUCKET)
                entry = await bus.kv_read(kv, names.applied_key(session_id)) if kv is not None else None
                if entry is not None:
                    cursor = decode(entry.value or b"", AppliedCursor)
            if cursor is None or (cursor.server_id, cursor.version) != (owner.server_id, owner.version):
                # Nothing reported by this owner yet: count from where it stands as far as we know.
                cursor = AppliedCursor(server_id=owner.server_id, version=owner.version, cursor=tail.view.released)
            self._applied[session_id] = cursor
        return cursor.cursor + self.max_unapplied - tail.view.released

    async def _on_kick(self, kick: Kick) -> KickReply:
        tail = await self.pump(session_log.check_session_id(kick.session_id))
        return KickReply(session_id=kick.session_id, released=tail.view.released)

    async def released(self, session_id: str, *, fresh: bool = False) -> int:
        """How far the session's input has been released (from the cache unless `fresh`)."""
        tail = None if fresh else self.tails.get(session_id)
        if tail is None:
            tail = self.tails[session_id] = await session_log.read_tail(self.js, session_id)
        return tail.view.released

    async def _consume(self) -> None:
        while True:
            try:
                msgs = await self._sub.fetch(self.batch, timeout=1.0)
            except TimeoutError:  # nothing arrived (nats' TimeoutError is one too)
                continue
            except Exception as e:  # an outage: the durable consumer resumes after it
                self.log.warning("gateway_fetch_failed", error=str(e) or type(e).__name__)
                await asyncio.sleep(0.2)
                continue
            try:
                await self._handle(msgs)
            except asyncio.CancelledError:  # stopping: hand unfinished items straight to another instance
                for m in msgs:
                    with contextlib.suppress(Exception):
                        await m.nak()
                raise
            except Exception as e:  # a bug or a message no check foresaw: the consumer must go on
                _consume_failed.add(1)
                self.log.exception("gateway_handle_failed", error=repr(e))
                await asyncio.sleep(NET_PAUSE_S)  # unacked: redelivered after ACK_WAIT_S
                continue
            if len(msgs) < self.batch:
                # No backlog: the instances that stored these items have released them, or are releasing
                # them now (this pump waited for that under the session's lock). The consumer is only the
                # net, so let the next deliveries gather instead of fetching and acking after every store:
                # that work lands on this loop and nats-server between a store and its release.
                await asyncio.sleep(NET_PAUSE_S)

    async def _handle(self, msgs) -> None:
        """Pump the sessions of `msgs` that need it, ack the rest."""
        by_session: defaultdict[str, list[tuple[InputItem, int]]] = defaultdict(list)
        for m in msgs:
            try:
                batch = decode(m.data, InputBatch)
                pos = m.metadata.sequence.stream
            except (errors.StatefleetError, ValueError) as e:
                _malformed.add(1)
                self.log.error("input_batch_undecodable", subject=m.subject, error=repr(e))
                continue
            if not batch.items or batch.session_id != names.input_session_id(m.subject):
                # Ingress never stores these; whoever did, nothing in it can be released.
                _malformed.add(1)
                self.log.error("input_batch_malformed", subject=m.subject, items=len(batch.items))
                continue
            by_session[batch.session_id].extend((item, pos) for item in batch.items)
        # Most items were offered by the instance that stored them and are released already: the
        # cached tail says so (as `pump` itself would conclude) without waiting for the session's lock.
        todo = {sid: items for sid, items in by_session.items()
                if (tail := self.tails.get(sid)) is None or tail.view.released < items[-1][0].seq}
        results = await asyncio.gather(*(self.pump(sid, items) for sid, items in todo.items()),
                                       return_exceptions=True)
        failed = set()
        for sid, result in zip(todo, results, strict=True):
            if isinstance(result, BaseException):
                failed.add(sid)
                self.log.warning("pump_failed", session_id=sid, error=repr(result))
        # An item is done once released, or waiting for a claim (whose kick releases it). Items of a
        # pump that failed are not acked: the consumer redelivers them after ACK_WAIT_S.
        for m in msgs:
            if names.input_session_id(m.subject) not in failed:
                await bus.quietly(m.ack())
                await asyncio.sleep(0)  # an ack does not yield: let a waiting release go between them

    async def pump(self, session_id: str, prefetched: list[tuple[InputItem, int]] = ()) -> session_log.Tail:
        """Release every stored item after the cursor to the claimed owner; return the last tail seen."""
        async with self._locks[session_id]:
            ready = {item.seq: (item, pos) for item, pos in prefetched}
            # With items in hand, release up to them (filling gaps from the stream); on a kick, everything.
            target = max(ready, default=None)
            must_read = False
            while True:
                tail = None if must_read else self.tails.get(session_id)
                read_now = tail is None
                if read_now:
                    tail = self.tails[session_id] = await session_log.read_tail(self.js, session_id)
                if target is not None and tail.view.released >= target:
                    return tail  # the items in hand are released; re-releases after a newer claim are its kick's
                owner = core.current_owner(tail.view)
                room = await self._credit(session_id, owner, tail) if owner else 0
                room = max(room, _to_clear(ready, tail.view.released))
                if owner and room <= 0:
                    _held.add(1)
                    self._held.add(session_id)  # released once the owner's cursor moves
                    return tail
                batch = await self._next_items(session_id, tail, ready, room) if owner else []
                if batch:
                    event = core.decide_release(tail.view, owner, [i for i, _ in batch], input_pos=batch[-1][1])
                    try:
                        self.tails[session_id] = await session_log.append(self.js, session_id, tail, event)
                        _released.add(len(batch))
                    except errors.Conflict:
                        _cas_lost.add(1)
                        self.tails.pop(session_id, None)
                    must_read = False
                    continue
                if read_now:
                    return tail  # nothing to release: unclaimed items wait in the input stream for the claim
                # Only the log may say "nothing to do": a cached view can hide a newer claim that
                # re-opened released items, or a claim whose kick came before these items.
                must_read = True

    async def _next_items(self, session_id: str, tail: session_log.Tail, ready: dict[int, tuple[InputItem, int]],
                          room: int) -> list[tuple[InputItem, int]]:
        out: list[tuple[InputItem, int]] = []
        size, seq, most = 0, tail.view.released + 1, min(self.max_release_items, room)
        while seq in ready and len(out) < most and size < self.max_release_bytes:
            out.append(ready[seq])
            size += len(ready[seq][0].data)
            seq += 1
        if out:
            return out
        return await input_reads.read_items(self.js, session_id, tail.view.released, tail.view.input_pos,
                                            max_items=most, max_bytes=self.max_release_bytes)

    def forget(self, session_id: str) -> None:
        """A closed session: drop what this instance kept for it (a pump in progress keeps its lock)."""
        self.tails.pop(session_id, None)
        self._applied.pop(session_id, None)
        self._held.discard(session_id)
        lock = self._locks.get(session_id)
        if lock is not None and not lock.locked():
            del self._locks[session_id]


def _to_clear(ready: dict[int, tuple[InputItem, int]], released: int) -> int:
    """How many items after `released` a release must take to include the last `clear` in hand (0: none)."""
    last = max((seq for seq, (item, _) in ready.items() if item.kind == "clear" and seq > released), default=0)
    return max(0, last - released)
