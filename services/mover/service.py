"""The move coordinator: admits moves, drives source and destination through the six verbs, publishes receipts.

Request `sf.mover.move` (MoveRequest) → MoveReceipt, once the move is over.
Every request gets a receipt on `sf.mover.receipt.<session_id>` (stream
SF_MOVES): committed, rolled_back (with the failing step's reason) or rejected.
A fenced session moves only from its current owner, and a committed move hands
ownership over exactly once: fence `assign`s the destination at the next version
(compare-and-set against the version seen at the start), the destination claims,
and only then does the source, frozen since the final round, drop its copy.
A move is journalled in the `sf_moves_inflight` KV before it touches any host;
a coordinator that starts and finds a journalled move closes it out (rollback,
or finishing a commit the destination already made) and publishes its receipt.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Annotated

import msgspec

from libs import bus, names
from libs.config import BaseConfig, PositiveFloat
from libs.errors import Conflict, IntegrityError, Rejected, StatefleetError, Timeout
from libs.fence.ownership import assign, read_owner
from libs.path_ewma import PathEwma
from libs.schemas.base import decode, encode
from libs.schemas.motion import (
    AdmitMove,
    AdmitVerdict,
    Manifest,
    Migrate,
    MigrateResult,
    MoveReceipt,
    MoveRequest,
    MoveStarted,
    RegisterState,
    SlotDone,
    SlotRequest,
    Verified,
)
from libs.service import Service
from services.mover.plan import MovePlanner

VERB_TIMEOUT_S = 10.0


class MoverConfig(BaseConfig, kw_only=True):
    prior_bandwidth_bps: PositiveFloat = 1.0e9  # a path's assumed rate until a move over it completes
    ewma_alpha: Annotated[float, msgspec.Meta(gt=0, le=1)] = 0.3
    setup_s: Annotated[float, msgspec.Meta(ge=0)] = 0.05  # fixed per-move cost: verbs, connect, commit
    chunk_bytes: Annotated[int, msgspec.Meta(ge=4096, le=1 << 28)] = 1 << 20
    round_cap: Annotated[int, msgspec.Meta(ge=1, le=64)] = 4


class MoverService(Service):
    name = "mover"
    config_type = MoverConfig
    config: MoverConfig

    async def setup(self) -> None:
        cfg = self.config
        self.planner = MovePlanner(prior_bps=cfg.prior_bandwidth_bps, paths=PathEwma(cfg.ewma_alpha), setup_s=cfg.setup_s)
        await bus.ensure_stream(self.js, bus.StreamSpec(name=names.MOVES_STREAM, subjects=[names.MOVE_RECEIPT_SUBJECTS],
                                                        replicas=cfg.nats_replicas))
        self.journal = await bus.ensure_kv(self.js, names.MOVES_INFLIGHT_BUCKET, replicas=cfg.nats_replicas)
        await self.recover()
        await bus.serve(self.nc, names.MOVER_MOVE, MoveRequest, self.move, queue=self.name)

    # -------------------------------------------------------------- one move

    async def move(self, req: MoveRequest) -> MoveReceipt:
        move_id = req.move_id or uuid.uuid4().hex
        log = self.log.bind(move_id=move_id, session_id=req.session_id)
        receipt = MoveReceipt(move_id=move_id, session_id=req.session_id, source=req.source, dest=req.dest,
                              outcome="rejected")
        times = receipt.times
        started = time.monotonic()
        begun = False
        owner_version = 0
        try:
            owner_version = await self._owner_version(req)
            t = time.monotonic()
            # Structure only: sizing needs no pass over the bytes; the fingerprint verify and commit check is
            # the one migrate takes over the frozen source while it sends.
            m = await self._verb(req.source, "register_state", RegisterState(
                session_id=req.session_id, move_id=move_id, fingerprint=False), Manifest)
            times.register_s = time.monotonic() - t
            receipt.state_bytes = m.total_bytes
            decision = self.planner.decide(req, m.total_bytes)
            receipt.predicted_s = decision.predicted_s
            if not decision.admitted:
                raise Rejected(decision.reason)
            self.planner.begin(move_id, req)
            begun = True
            try:
                await self._journal(move_id, req, owner_version)
                await self._drive(req, move_id, m, decision.bandwidth_bps, started, receipt, owner_version)
            finally:
                self.planner.end(move_id)
        except Rejected as e:
            receipt.reason = e.detail
            if begun:  # e.g. the destination declined: drop anything it armed and the journal entry
                await self._rollback(req, move_id)
        except StatefleetError as e:
            receipt.outcome, receipt.reason = "rolled_back", f"{e.code}: {e.detail}"
            if await self._rollback(req, move_id) == "committed":  # only the commit's reply was lost
                receipt.outcome, receipt.reason = "committed", f"destination had committed ({receipt.reason})"
                await self._hand_over(req, move_id, owner_version)
        except Exception as e:  # a bug must still roll back and leave a receipt
            log.exception("move_failed")
            receipt.outcome, receipt.reason = "rolled_back", f"internal: {type(e).__name__}"
            await self._rollback(req, move_id)
        receipt.at = time.time()
        await self._publish(receipt)
        log.info("move_done", outcome=receipt.outcome, reason=receipt.reason)
        return receipt

    async def _owner_version(self, req: MoveRequest) -> int:
        """Fence's version of the source's ownership; 0 for a session fence does not know."""
        owner = (await read_owner(self.js, req.session_id)).view.owner
        if owner is None:
            return 0
        if owner.server_id != req.source:
            raise Rejected(f"{req.source} does not own the session ({owner.server_id} v{owner.version} does)")
        return owner.version

    async def _drive(self, req: MoveRequest, move_id: str, m: Manifest, bandwidth_bps: float,
                     started: float, receipt: MoveReceipt, owner_version: int) -> None:
        times = receipt.times
        left = lambda: req.deadline_s - (time.monotonic() - started)  # noqa: E731
        t = time.monotonic()
        verdict = await self._verb(req.dest, "admit", AdmitMove(
            session_id=req.session_id, move_id=move_id, state_bytes=m.total_bytes,
            dirty_rate_bps=req.dirty_rate_bps, horizon_s=max(left(), 1e-3), bandwidth_bps=bandwidth_bps,
            setup_s=self.config.setup_s), AdmitVerdict)
        times.admit_s = time.monotonic() - t
        if not verdict.admissible:
            raise Rejected(f"destination {req.dest}: {verdict.reason}")
        t = time.monotonic()
        async with asyncio.timeout(max(left(), 1e-3)):
            result = await self._verb(req.source, "migrate", Migrate(
                session_id=req.session_id, move_id=move_id, dest_host=req.dest, dest_addr=verdict.data_addr,
                token=verdict.token, mode=req.mode, round_cap=self.config.round_cap, codec=req.codec,
                transport=req.transport, dest_machine=verdict.machine, dest_device=verdict.device,
                chunk_bytes=self.config.chunk_bytes, deadline_s=max(left(), 1e-3)),
                MigrateResult, timeout_s=max(left(), 1e-3) + 1)
        times.migrate_s, times.freeze_s = time.monotonic() - t, result.freeze_s
        receipt.rounds, receipt.wire_bytes, receipt.transport = result.rounds, result.wire_bytes, result.transport
        receipt.transfer_s = result.transfer_s
        receipt.fingerprint, receipt.state_bytes = result.manifest.fingerprint, result.manifest.total_bytes
        t = time.monotonic()
        slot = SlotRequest(session_id=req.session_id, move_id=move_id, manifest=result.manifest)
        ok = await self._verb(req.dest, "verify", slot, Verified, timeout_s=max(VERB_TIMEOUT_S, left()))
        times.verify_s = time.monotonic() - t
        receipt.staging = ok.staging
        if not ok.ok:
            raise IntegrityError(f"destination verify failed: {ok.reason}")
        if left() <= 0:
            raise Timeout(f"deadline of {req.deadline_s}s passed before commit")
        t = time.monotonic()
        await self._verb(req.dest, "commit", slot, SlotDone, timeout_s=max(VERB_TIMEOUT_S, left()))
        receipt.outcome = "committed"  # the destination holds the state live: past the point of no return
        self.planner.paths.observe(req.source, req.dest, result.wire_bytes, result.transfer_s)
        try:
            await self._hand_over(req, move_id, owner_version)
        except Conflict as e:
            # Fence moved the session elsewhere meanwhile: the destination's copy is unowned (its host
            # closes it after a grace) and the source thaws to do whatever fence says.
            receipt.outcome, receipt.reason = "rolled_back", f"ownership changed during the move: {e.detail}"
            await self._verb(req.source, "rollback", SlotRequest(session_id=req.session_id, move_id=move_id),
                             SlotDone)
            await self.journal.delete(move_id)
        except StatefleetError as e:  # the journal entry stays: a restarted coordinator finishes the hand-over
            receipt.reason = f"committed; hand-over pending: {e.detail}"
        times.commit_s = time.monotonic() - t

    async def _hand_over(self, req: MoveRequest, move_id: str, owner_version: int) -> None:
        """After the destination committed: fence assigns it (once), then the source drops its copy."""
        if owner_version:
            owner = (await read_owner(self.js, req.session_id)).view.owner
            done = owner is not None and (owner.server_id, owner.version) == (req.dest, owner_version + 1)
            if not done:
                await assign(self.nc, req.session_id, req.dest, expect_version=owner_version)
        await self._finish_commit(req, move_id)

    async def _finish_commit(self, req: MoveRequest, move_id: str) -> None:
        """After the destination committed: the source releases its copy; the journal entry goes."""
        await self._verb(req.source, "commit", SlotRequest(session_id=req.session_id, move_id=move_id), SlotDone)
        await self.journal.delete(move_id)

    async def _rollback(self, req: MoveRequest, move_id: str) -> str:
        """Fail closed: drop the destination's slot, leave the source authoritative. Best effort on each side.

        Returns "committed" when the destination refuses because it already committed (a lost reply):
        then the move stands and the caller finishes it instead.
        """
        for host in (req.dest, req.source):
            try:
                await self._verb(host, "rollback", SlotRequest(session_id=req.session_id, move_id=move_id),
                                 SlotDone)
            except Conflict:
                return "committed"
            except StatefleetError as e:  # the slot's lease expires on its own if the host is unreachable
                self.log.warning("rollback_failed", host=host, move_id=move_id, error=e.detail)
        try:
            await self.journal.delete(move_id)
        except Exception as e:
            self.log.warning("journal_delete_failed", move_id=move_id, error=str(e))
        return "rolled_back"

    # -------------------------------------------------------------- journal, recovery, receipts

    async def _journal(self, move_id: str, req: MoveRequest, owner_version: int) -> None:
        started = MoveStarted(move_id=move_id, session_id=req.session_id, source=req.source, dest=req.dest,
                              lease_s=req.deadline_s, at=time.time(), owner_version=owner_version)
        await self.journal.put(move_id, encode(started))

    async def recover(self) -> None:
        """Close out moves a previous coordinator journalled but never finished."""
        for entry in await bus.kv_entries(self.journal):
            started = decode(entry.value, MoveStarted)
            req = MoveRequest(session_id=started.session_id, source=started.source, dest=started.dest,
                              deadline_s=started.lease_s, move_id=started.move_id)
            receipt = MoveReceipt(move_id=started.move_id, session_id=started.session_id, source=started.source,
                                  dest=started.dest, outcome="rolled_back",
                                  reason="coordinator restarted mid-move", at=time.time())
            try:
                if await self._rollback(req, started.move_id) == "committed":  # committed before the crash
                    await self._hand_over(req, started.move_id, started.owner_version)
                    receipt.outcome, receipt.reason = "committed", "completed by a restarted coordinator"
            except StatefleetError as e:
                receipt.reason += f"; source release failed ({e.detail}), retried at the next start"
            await self._publish(receipt)

    async def _publish(self, receipt: MoveReceipt) -> None:
        await self.js.publish(names.move_receipt_subject(receipt.session_id), encode(receipt))

    async def _verb(self, host: str, verb: str, msg, reply_type, timeout_s: float = VERB_TIMEOUT_S):
        return await bus.request(self.nc, names.engine_subject(host, verb), msg, reply_type, timeout_s=timeout_s)
