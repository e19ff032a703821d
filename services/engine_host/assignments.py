"""Fenced sessions on an engine host: take what fence assigns here, claim it, apply only its releases.

For every assignment to this host that the log still shows as the latest:
  1. install the state, gated (it runs no block yet): keep it if the host already holds the
     session (a move installed it), else restore the latest checkpoint from fence's metadata,
     else start from the seed;
  2. claim `(host_id, version)` with the input cursor that state reflects: fence re-releases
     every item after it, so items released to a dead or moved-away owner are not lost;
  3. take the block journal (seal it: an older owner still running can record, and so publish,
     nothing more) and learn the blocks recorded after the installed state;
  4. regenerate those blocks exactly (each with the items and tier it recorded, output marked
     replayed), then ungate the session and apply the lease's items in order until the lease is
     revoked (a newer assign, a close, or the journal saying a newer owner sealed it).
From then on every block's consumed items are journaled before its output is published. A copy a
move installs here arrives gated (`gate_moved_in`) and runs no block before step 3 either: until
its claim it has no journal, and a block published unjournaled could not be regenerated exactly.
A revoked host never takes another item. If the session was closed, it shuts it down in
order; if it was assigned elsewhere, it stops taking input and leaves the copy to the mover
(which drops it after the move commits) or, when nothing moves it, closes it after a grace.
A copy a move installed here that fence never assigns here is closed after a grace too.
Periodic checkpoints go through the checkpoint store and are recorded at fence, so a
replacement can restore instead of replaying from the seed.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from typing import Protocol

import structlog

from libs import bus, logs
from libs.contracts import Contract
from libs.errors import Busy, Conflict, IntegrityError, NotFound, StatefleetError
from libs.fence.block_journal import BlockJournal, recorded_threads
from libs.fence.client import EngineClient, Lease
from libs.fence.replay import replay_plan
from libs.schemas.base import decode
from libs.schemas.common import InputItem
from libs.schemas.engine import CheckpointRef, OpenSession, SessionInfo
from libs.schemas.fence import AssignNotice, ConsumedBlock, SessionMeta
from libs.tasks import STOP_TIMEOUT_S, cancel_and_wait, report_death
from services.engine_host.journal import OutputJournal

log = structlog.get_logger("statefleet.engine_host.assignments")

BUSY_BACKOFF_S = 0.005
REPORT_EVERY_S = 0.5
TAKE_RETRY_S = 60.0



def open_spec(meta: SessionMeta, threads: int = 0) -> OpenSession:
    """The engine session a registered session starts as, from its contract and init inputs, at the
    thread count its block journal records (0: none yet, the first open pins this host's)."""
    contract = decode(meta.contract, Contract)  # a malformed one is a SchemaError, like every message
    return OpenSession(session_id=meta.session_id, backend=meta.backend, seed=meta.seed, prompt=meta.prompt,
                       image=meta.image, audio=meta.audio,
                       quality_floor=contract.quality_floor, session_class=contract.session_class,
                       period_ms=contract.release_period_ms, determinism=contract.determinism, threads=threads)


class FencedHost(Protocol):
    """What taking fenced sessions needs of the host's runtime (`runtime.EngineRuntime`)."""

    def holds(self, sid: str) -> bool: ...

    def moved_in(self) -> set[str]: ...

    def info(self, sid: str) -> SessionInfo: ...

    async def open(self, spec: OpenSession, *, gated: bool = False) -> SessionInfo: ...

    async def restore(self, sid: str, key: str, *, gated: bool = False) -> SessionInfo: ...

    def gate(self, sid: str) -> None: ...

    def ungate(self, sid: str) -> None: ...

    def attach_journal(self, sid: str, writer: BlockJournal) -> OutputJournal: ...

    async def replay_block(self, sid: str, block: ConsumedBlock) -> None: ...

    async def apply_input(self, item: InputItem) -> int: ...

    async def checkpoint(self, sid: str, *, delete_previous: bool = True) -> CheckpointRef: ...

    async def delete_checkpoint(self, key: str) -> None: ...

    async def close(self, sid: str, *, finish: bool = True) -> SessionInfo: ...


class Assignments:
    """Serves every session fence assigns to this host, one task per assignment (see the module doc)."""

    def __init__(self, client: EngineClient, host: FencedHost, *, checkpoint_every_s: float,
                 orphan_grace_s: float) -> None:
        self.client = client
        self.host = host
        self.checkpoint_every_s = checkpoint_every_s
        self.orphan_grace_s = orphan_grace_s
        self.serving: dict[str, asyncio.Task] = {}

    async def run(self) -> None:
        sweeper = asyncio.create_task(self._sweep_orphans(), name="sweep-orphans")
        try:
            await self._take_assignments()
        finally:
            sweeper.cancel()

    async def _take_assignments(self) -> None:
        async for notice in self.client.assignments():
            previous = self.serving.get(notice.session_id)
            if previous is not None and not previous.done():
                # A newer assignment to us supersedes the older lease; its task ends by revocation.
                await asyncio.wait({previous}, timeout=5.0)
            task = asyncio.create_task(self._serve(notice), name=f"serve:{notice.session_id}")
            task.add_done_callback(report_death("serve_task_failed", log))
            self.serving[notice.session_id] = task

    async def stop(self) -> None:
        await cancel_and_wait(self.serving.values(), timeout_s=STOP_TIMEOUT_S)
        await self.client.close()

    async def _serve(self, notice: AssignNotice) -> None:
        sid, version = notice.session_id, notice.version
        logs.bind(session_id=sid, server_id=self.client.server_id, version=version)
        held = self.host.holds(sid)

        async def install() -> tuple[SessionMeta, int | None]:
            meta = await self.client.meta(sid, init_media=True)  # a start from the seed needs them
            return meta, (None if meta.closed else await self._install(meta))

        try:
            meta, cursor = await self._through_outages(install, sid, version)
            if cursor is None:
                return
        except StatefleetError as e:
            log.warning("take_failed", session_id=sid, version=version, code=e.code, detail=e.detail)
            return
        try:
            lease = await self.client.claim(sid, version, cursor)  # retries through outages itself
            journal, plan = await self._through_outages(lambda: self._take_journal(lease, installed_here=not held),
                                                        sid, version)
        except StatefleetError as e:
            log.warning("take_failed", session_id=sid, version=version, code=e.code, detail=e.detail)
            if not held:
                await self._close(sid, finish=False)  # we made this copy for nothing
            elif sid not in self.host.moved_in():
                with contextlib.suppress(NotFound):
                    self.host.ungate(sid)
            else:  # a moved-in copy not ours: gated (no block without a journal), closed after the grace
                await self._after_revocation(sid)
            return
        background = [asyncio.create_task(self._checkpoint_loop(lease, meta.checkpoint_ref, journal)),
                      asyncio.create_task(self._stop_when_fenced(lease, journal))]
        try:
            await self.apply_releases(lease, plan)
        except StatefleetError as e:
            # The session failed here (a backend error closes it) or its input broke order: take no
            # more input under this lease; fence re-releases from the claim cursor to whoever is next.
            log.error("input_stopped", session_id=sid, version=version, code=e.code, detail=e.detail)
            await lease.stop()
        finally:
            await cancel_and_wait(background, timeout_s=STOP_TIMEOUT_S)
        await self._after_revocation(sid)

    async def _through_outages(self, step, sid: str, version: int):
        """`await step()`, retried while the bus fails it transiently (a leader election, a lost
        answer) for up to `TAKE_RETRY_S`: giving up would leave the session assigned here and served
        by nobody. Other errors, and the last transient one, surface as `StatefleetError`."""
        return await bus.retry_transient(step, time.monotonic() + TAKE_RETRY_S, lambda e: log.warning(
            "take_retry", session_id=sid, version=version, code=e.code, detail=e.detail))

    async def _install(self, meta: SessionMeta) -> int:
        """Make the session live here, gated; return the input cursor its state reflects."""
        sid = meta.session_id
        if self.host.holds(sid):
            self.host.gate(sid)
            return self.host.info(sid).input_cursor  # installed by a move (pending items travel along)
        if meta.checkpoint_ref:
            try:
                info = await self.host.restore(sid, meta.checkpoint_ref, gated=True)
                log.info("restored", session_id=sid, key=meta.checkpoint_ref, cursor=info.input_cursor)
                return info.input_cursor
            except (NotFound, IntegrityError) as e:
                # Deterministic backends replay to the same state: seed + every item from the start.
                log.warning("checkpoint_unusable", session_id=sid, key=meta.checkpoint_ref, code=e.code)
        # From the seed at the count the session's blocks were recorded at, so replayed ones are the same bytes.
        threads = await recorded_threads(self.client.js, sid)
        info = await self.host.open(open_spec(meta, threads), gated=True)
        return info.input_cursor

    async def _take_journal(self, lease: Lease, *, installed_here: bool) -> tuple[OutputJournal, list[ConsumedBlock]]:
        """Seal the session's block journal for our claim and attach it; return the recorded blocks
        after the installed state, which must be regenerated before any live block."""
        sid = lease.session_id
        writer, entries = await BlockJournal.take(self.client.js, sid, lease.owner, threads=self.host.info(sid).threads)
        if installed_here:
            await self._catch_up_checkpoint(sid)
        info = self.host.info(sid)
        try:
            plan = replay_plan(entries, info.blocks_done, info.consumed_seq)
        except IntegrityError as e:
            # Not exact any more (e.g. the checkpoint was unusable and the journal before it is gone):
            # go on live rather than strand the session.
            log.error("journal_unusable", session_id=sid, detail=e.detail, blocks_done=info.blocks_done)
            plan = []
        if plan:
            log.info("replaying", session_id=sid, after_block=info.blocks_done, blocks=len(plan),
                     through_block=plan[-1].block)
        return self.host.attach_journal(sid, writer), plan

    async def _catch_up_checkpoint(self, sid: str) -> None:
        """A former owner presumed dead may have run on and recorded a newer checkpoint after we read
        the meta (our claim ends that), and then purged its journal up to it: the blocks between our
        state and that checkpoint are gone. Install that checkpoint instead (still gated, nothing shown)."""
        meta = await self.client.meta(sid)
        if not meta.checkpoint_ref or meta.checkpoint_block <= self.host.info(sid).blocks_done:
            return
        log.info("checkpoint_moved_on", session_id=sid, key=meta.checkpoint_ref, block=meta.checkpoint_block)
        await self.host.close(sid, finish=False)
        await self.host.restore(sid, meta.checkpoint_ref, gated=True)

    async def apply_releases(self, lease: Lease, plan: list[ConsumedBlock] | None = None) -> None:
        """Regenerate the recorded blocks in `plan` as their items arrive, then ungate the session and
        apply the lease's released items in order until it is revoked, reporting progress to fence."""
        sid = lease.session_id
        todo = deque(plan or [])
        # The installed state may be past the claim's cursor (a checkpoint caught up to after the claim).
        await self._regenerate(sid, todo, max(lease.cursor, self.host.info(sid).input_cursor))
        last_report = 0.0
        async for item in lease:
            if lease.revoked.is_set():
                break  # a revoked incarnation applies nothing more, even what reached it before
            if not await self._accept(item):
                continue
            if todo:
                await self._regenerate(sid, todo, item.seq)
            now = time.monotonic()
            # Caught up: report now, since fence releases more only as the cursor advances (a bounded
            # per-session queue); busy: at most every REPORT_EVERY_S.
            if now - last_report >= REPORT_EVERY_S or lease.backlog == 0:
                last_report = now
                with contextlib.suppress(StatefleetError):
                    await lease.report_applied(item.seq)

    async def _regenerate(self, sid: str, todo: deque[ConsumedBlock], cursor: int) -> None:
        """Run every recorded block whose items are all accepted (up to `cursor`); ungate once none is left."""
        while todo and todo[0].last_seq <= cursor:
            await self.host.replay_block(sid, todo.popleft())
        if not todo:
            self.host.ungate(sid)

    async def _accept(self, item: InputItem) -> bool:
        """Hand one released item to the runtime, waiting while its input queue is full."""
        while True:
            try:
                await self.host.apply_input(item)
                return True
            except Busy:
                await asyncio.sleep(BUSY_BACKOFF_S)
            except Conflict as e:
                if e.fields.get("reason") == "duplicate":
                    return False  # already in the installed state (it travelled with a move)
                raise

    async def _after_revocation(self, sid: str) -> None:
        try:
            meta = await self.client.meta(sid)
        except StatefleetError:
            meta = None
        if not self.host.holds(sid):
            return  # dropped by a committed move already
        if meta is not None and meta.closed:
            await self._close(sid, finish=True)
            return
        # Assigned elsewhere: a mover drops our copy once its move commits. A failover
        # (we were presumed dead) moves nothing, so the copy goes after a grace.
        await asyncio.sleep(self.orphan_grace_s)
        if self.host.holds(sid) and self.client.lease(sid) is None:
            await self._close(sid, finish=False)

    async def _sweep_orphans(self) -> None:
        """A moved-in copy that fence never assigns here (the hand-over lost a race) is closed:
        seen unassigned on two sweeps in a row, it has waited at least one grace period."""
        seen: set[str] = set()
        while True:
            await asyncio.sleep(self.orphan_grace_s)
            orphans = {sid for sid in self.host.moved_in()
                       if sid not in self.serving and self.client.lease(sid) is None}
            for sid in orphans & seen:
                log.warning("orphan_closed", session_id=sid)
                await self._close(sid, finish=False)
            seen = orphans - seen

    async def _close(self, sid: str, *, finish: bool) -> None:
        with contextlib.suppress(NotFound):
            await self.host.close(sid, finish=finish)
            log.info("session_closed", session_id=sid, finish=finish)

    async def _stop_when_fenced(self, lease: Lease, journal: OutputJournal) -> None:
        """A newer owner sealed the journal (we were presumed dead): take no more input."""
        await journal.fenced.wait()
        log.warning("fenced_by_journal", session_id=lease.session_id, version=lease.owner.version)
        await lease.stop()

    async def _checkpoint_loop(self, lease: Lease, recorded: str | None, journal: OutputJournal) -> None:
        """`recorded`: the checkpoint fence points at (only this loop moves it while we hold the lease);
        None when a failed round left that unknown, and fence is asked again."""
        sid = lease.session_id
        while not lease.revoked.is_set():
            await asyncio.sleep(self.checkpoint_every_s)
            if lease.revoked.is_set():
                return
            try:
                if recorded is None:
                    recorded = (await self.client.meta(sid)).checkpoint_ref
                ref = await self.host.checkpoint(sid, delete_previous=False)
                await self.client.checkpoint(sid, lease.owner.version, ref.key, ref.consumed_seq, ref.blocks_done)
            except StatefleetError as e:  # the next round tries again; the recorded checkpoint still stands
                log.warning("checkpoint_failed", session_id=sid, code=e.code, detail=e.detail)
                recorded = None  # a lost reply may still have moved it
                continue
            # Only once fence points at the new checkpoint may the one it pointed at go.
            previous, recorded = recorded, ref.key
            if previous and previous != ref.key:
                with contextlib.suppress(StatefleetError):
                    await self.host.delete_checkpoint(previous)
            with contextlib.suppress(StatefleetError):  # only costs storage until the next round
                await journal.forget_through(ref.blocks_done)

