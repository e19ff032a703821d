"""The engine-side endpoint of state motion: the six verbs on `sf.engine.<host_id>.<verb>` and the data plane.

An engine host mounts one `MotionEndpoint(nc, host_id, host, data_bind)` and
advertises `endpoint.data_addr` as its `EngineEntry.data_addr`. One endpoint
plays both roles: source (register_state, migrate, commit = drop the old copy,
rollback = stay authoritative) and destination (admit = arm a shadow slot with a
one-time token, verify, commit = re-verify and install, rollback = drop the slot).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any

import structlog
import torch

from libs import admissibility, bus, names
from libs.errors import (
    Conflict,
    IntegrityError,
    NotFound,
    StatefleetError,
    Timeout,
    Unauthorized,
    Unavailable,
)
from libs.motion import machine, manifest, route
from libs.motion.host import StateHost
from libs.motion.inprocess import InProcessChannel, local_receivers
from libs.motion.mooncake import MooncakeChannel, MooncakeEngine
from libs.motion.pool import StagingPool
from libs.motion.receiver import DEFAULT_LIMITS, DataPlane
from libs.motion.receiver import Limits as DataPlaneLimits
from libs.motion.sender import SendOptions, send_state
from libs.motion.shm import DEVICE_CHUNK_BYTES, ShmChannel
from libs.motion.slot import ShadowSlot, SlotState
from libs.motion.tcp import TcpChannel
from libs.motion.transport import Channel
from libs.schemas.motion import (
    AdmitMove,
    AdmitVerdict,
    Manifest,
    Migrate,
    MigrateResult,
    RegisterState,
    SlotDone,
    SlotRequest,
    Verified,
)
from libs.telemetry import counter, traced

log = structlog.get_logger("statefleet.motion.endpoint")
VERBS = ("register_state", "admit", "migrate", "verify", "commit", "rollback")
_verbs = counter("sf_motion_verbs_total", "State-motion verbs served, by verb and outcome")
SLOT_GRACE_S = 5.0  # a slot outlives its move's horizon by this much before it is reaped


class MotionEndpoint:
    def __init__(self, nc: bus.Client, host_id: str, host: StateHost, data_bind: str = "127.0.0.1:0", *,
                 tier: str = "T0", mooncake: MooncakeEngine | None = None, staging_bytes: int = 0,
                 machine_id: str | None = None, data_limits: DataPlaneLimits = DEFAULT_LIMITS) -> None:
        self.nc, self.host_id, self.host, self.tier = nc, host_id, host, tier
        self.mooncake = mooncake
        self.machine = machine.identity() if machine_id is None else machine_id
        # Incoming host slots come from here; on GPU hosts the arena is pinned (device slots use the
        # caching allocator, which already reuses its memory).
        self.pool = StagingPool(staging_bytes, pin=self._device().type == "cuda") if staging_bytes > 0 else None
        if mooncake is not None and self.pool is not None:
            mooncake.register_pool(self.pool)
        self.data = DataPlane(self._claim, data_bind, mooncake_engine=mooncake, limits=data_limits)
        self.slots: dict[str, ShadowSlot] = {}  # move_id -> incoming slot
        self.tokens: dict[str, ShadowSlot] = {}  # one-time data-plane tokens -> slot
        self.outgoing: dict[str, Manifest] = {}  # move_id -> manifest this host sent
        self.committed: dict[str, Manifest] = {}  # move_id -> manifest installed here (idempotent commit)
        self.frozen: dict[str, tuple[contextlib.AsyncExitStack, float]] = {}  # move_id -> (held boundary, until)
        self._subs: list[bus.Subscription] = []
        self._reaper: asyncio.Task | None = None

    @property
    def data_addr(self) -> str:
        return self.data.addr

    async def start(self) -> str:
        addr = await self.data.start()
        local_receivers[addr] = self._claim
        for verb in VERBS:
            handler, req = getattr(self, f"_on_{verb}"), _REQUESTS[verb]
            self._subs.append(await bus.serve(self.nc, names.engine_subject(self.host_id, verb), req,
                                              traced(f"motion.{verb}", _counted(verb, handler))))
        self._reaper = asyncio.create_task(self._reap(), name=f"motion-reaper:{self.host_id}")
        return addr

    async def stop(self) -> None:
        for sub in self._subs:
            await sub.unsubscribe()
        local_receivers.pop(self.data.addr, None)
        if self._reaper:
            self._reaper.cancel()
            await asyncio.gather(self._reaper, return_exceptions=True)
        for move_id in list(self.frozen):
            await self._thaw(move_id)
        await self.data.stop()
        for slot in self.slots.values():
            slot.fail("endpoint stopped")
        if self.pool is not None:
            self.pool.close()

    # -------------------------------------------------------------- source side

    async def _on_register_state(self, req: RegisterState) -> Manifest:
        async with self.host.block_boundary(req.session_id):
            tree = self.host.state_tree(req.session_id)
            return await manifest.register(req.session_id, tree, tier=self.tier,
                                           descriptor=self.host.session_descriptor(req.session_id),
                                           fingerprint=req.fingerprint)

    async def _on_migrate(self, req: Migrate) -> MigrateResult:
        if req.move_id in self.outgoing:
            raise Conflict(f"move {req.move_id} was already sent", move_id=req.move_id)

        way = route.choose(req.transport, in_process=req.dest_addr in local_receivers,
                           same_machine=bool(self.machine) and req.dest_machine == self.machine,
                           source_device=self._device().type, dest_device=req.dest_device, mode=req.mode)
        chunk_bytes = req.chunk_bytes
        if way in ("shm", "inprocess") and self._device().type == req.dest_device == "cuda":
            chunk_bytes = DEVICE_CHUNK_BYTES  # device to device: few large chunks, each fingerprinted there

        async def open_channel(layout: Manifest) -> Channel:
            if way == "mooncake":
                if self.mooncake is None:
                    raise Unavailable(f"host {self.host_id} runs no mooncake engine")
                return await MooncakeChannel.open(self.mooncake, req.dest_addr, req.token, layout, chunk_bytes)
            if way == "inprocess":
                return InProcessChannel.open(req.dest_addr, req.token, layout, chunk_bytes, self._device().type)
            if way == "shm":
                return await ShmChannel.open(req.dest_addr, req.token, layout, chunk_bytes)
            return await TcpChannel.open(req.dest_addr, req.token, layout, chunk_bytes,
                                         codec=req.codec, byte_planes=req.byte_planes)

        opts = SendOptions(mode=req.mode, round_cap=max(1, req.round_cap),
                           converge_fraction=req.converge_fraction, chunk_bytes=chunk_bytes)
        hold = contextlib.AsyncExitStack()
        try:
            async with asyncio.timeout(req.deadline_s):
                result = await send_state(self.host, req.session_id, open_channel, opts, hold, tier=self.tier)
        except TimeoutError:
            await hold.aclose()
            raise Timeout(f"move {req.move_id} did not finish within {req.deadline_s}s",
                          move_id=req.move_id) from None
        except BaseException:
            await hold.aclose()
            raise
        # The session stays frozen until the move is decided (commit drops it, rollback resumes it),
        # or until the move's horizon has certainly passed if no coordinator ever says.
        self.frozen[req.move_id] = (hold, time.monotonic() + req.deadline_s + SLOT_GRACE_S)
        self.outgoing[req.move_id] = result.manifest
        result.transport = way
        return result

    async def _thaw(self, move_id: str) -> None:
        held = self.frozen.pop(move_id, None)
        if held is not None:
            await held[0].aclose()

    # -------------------------------------------------------------- destination side

    async def _on_admit(self, req: AdmitMove) -> AdmitVerdict:
        if any(s.session_id == req.session_id for s in self.slots.values()):
            return AdmitVerdict(admissible=False, reason="a move into this session is already staged here")
        try:
            self.host.state_tree(req.session_id)
            return AdmitVerdict(admissible=False, reason=f"host {self.host_id} already holds the session live")
        except NotFound:
            pass
        verdict = admissibility.evaluate(admissibility.Transfer(
            state_bytes=req.state_bytes, dirty_rate_bps=req.dirty_rate_bps, horizon_s=req.horizon_s,
            bandwidth_bps=req.bandwidth_bps, setup_s=req.setup_s))
        if not verdict.admissible:
            return AdmitVerdict(admissible=False, reason=verdict.reason, t_migrate_s=verdict.t_migrate_s)
        token = secrets.token_hex(16)
        slot = ShadowSlot(req.session_id, req.move_id, token, req.state_bytes, self._device(),
                          lease_s=req.horizon_s + SLOT_GRACE_S, staging=self.pool)
        self.slots[req.move_id] = self.tokens[token] = slot
        return AdmitVerdict(admissible=True, t_migrate_s=verdict.t_migrate_s, token=token, data_addr=self.data_addr,
                            machine=self.machine, device=self._device().type)

    def _device(self) -> torch.device:
        return torch.device(self.host.device)

    def _claim(self, token: str) -> ShadowSlot:
        """Redeem a one-time token for its slot; a stray, reused or expired token gets nothing."""
        slot = self.tokens.pop(token, None)
        if slot is None or slot.expired or slot.state is not SlotState.ARMED:
            raise Unauthorized("unknown, used or expired data-plane token")
        return slot

    async def _on_verify(self, req: SlotRequest) -> Verified:
        slot = self._slot(req)
        if req.manifest is None:
            raise IntegrityError("verify needs the source's manifest", move_id=req.move_id)
        try:
            await slot.verify(req.manifest, full=False)  # commit re-reads every byte
        except (IntegrityError, Conflict) as e:
            return Verified(ok=False, reason=e.detail, staging=slot.staging)
        return Verified(ok=True, staging=slot.staging)

    async def _on_commit(self, req: SlotRequest) -> SlotDone:
        if req.move_id in self.committed:
            return SlotDone(manifest=self.committed[req.move_id])
        if req.move_id in self.outgoing:  # source: the destination holds the state now
            try:
                await self.host.drop_session(req.session_id)
            except NotFound:
                pass  # already gone (e.g. closed after its lease was revoked)
            finally:
                await self._thaw(req.move_id)
            return SlotDone(manifest=self.outgoing.pop(req.move_id))
        slot = self._slot(req)
        if req.manifest is None:
            raise IntegrityError("commit needs the source's manifest", move_id=req.move_id)
        verified = await slot.verify(req.manifest, full=True)  # re-verify: every staged byte, re-read
        await self.host.install_state(req.session_id, verified.tree, verified.manifest.descriptor)
        self.committed[req.move_id] = verified.manifest
        self._drop(req.move_id)
        log.info("move_committed", session_id=req.session_id, move_id=req.move_id)
        return SlotDone(manifest=verified.manifest)

    async def _on_rollback(self, req: SlotRequest) -> SlotDone:
        if req.move_id in self.committed:
            raise Conflict(f"move {req.move_id} is committed here", move_id=req.move_id)
        sent = self.outgoing.pop(req.move_id, None)  # source: nothing to undo, it stayed authoritative
        await self._thaw(req.move_id)
        slot = self.slots.get(req.move_id)
        if slot is not None:
            slot.fail("rolled back")
            self._drop(req.move_id)
        return SlotDone(manifest=sent)

    def _slot(self, req: SlotRequest) -> ShadowSlot:
        slot = self.slots.get(req.move_id)
        if slot is None or slot.session_id != req.session_id:
            raise NotFound(f"no staged move {req.move_id} for session {req.session_id}", move_id=req.move_id)
        return slot

    def _drop(self, move_id: str) -> None:
        slot = self.slots.pop(move_id, None)
        if slot is not None:
            self.tokens.pop(slot.token, None)
            slot.release()

    async def _reap(self) -> None:
        while True:
            await asyncio.sleep(0.5)
            now = time.monotonic()
            for move_id, slot in list(self.slots.items()):
                if now > slot.expires_at:
                    slot.fail("lease expired")
                    self._drop(move_id)
                    log.info("slot_expired", session_id=slot.session_id, move_id=move_id)
            for move_id, (_, until) in list(self.frozen.items()):
                if now > until:  # no coordinator decided the move: the source stays authoritative and runs on
                    self.outgoing.pop(move_id, None)
                    await self._thaw(move_id)
                    log.warning("freeze_expired", move_id=move_id)


def _counted(verb: str, handler: Callable[[Any], Awaitable[Any]]) -> Callable[[Any], Awaitable[Any]]:
    """Count each served verb by its outcome: ok, or the typed error's code."""
    async def run(req: Any) -> Any:
        try:
            reply = await handler(req)
        except StatefleetError as e:
            _verbs.add(1, {"verb": verb, "outcome": e.code})
            raise
        _verbs.add(1, {"verb": verb, "outcome": "ok"})
        return reply
    return run


_REQUESTS = {"register_state": RegisterState, "admit": AdmitMove, "migrate": Migrate, "verify": SlotRequest,
             "commit": SlotRequest, "rollback": SlotRequest}
