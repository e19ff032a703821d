"""This host's copy of its device's capacity record (KV `sf_device_capacity`, one key per device).

Hosts that share a device measure it once, together: the first to create the device's key measures
(profile rows and the co-location curve) while the others wait for its result and adopt it, so no
host measures as if alone while a peer measures beside it. A measurer that dies leaves a claim whose
`until` passes; a waiting peer then takes the claim over. Serving refreshes the curve at the
concurrency it ran at (`capacity_model.observe`); every write is a compare-and-set on the record's
revision, and a lost one is decided again on the newer record.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import crc32c
import msgspec
import nats.js.errors
import structlog
from nats.js.kv import KeyValue

from libs import capacity_model as cm
from libs.schemas.base import decode, encode
from libs.schemas.capacity import Curve, DeviceCapacity
from libs.schemas.common import ProfileRow

log = structlog.get_logger("statefleet.engine_host.device_capacity")

# What a measurement hands back: the profile rows and the curves of the shapes it measured.
Measure = Callable[[set[str]], Awaitable[tuple[list[ProfileRow], list[Curve]]]]


def device_kv_key(device: str) -> str:
    """A KV key for a device key (machine ids hold characters keys may not)."""
    return f"dev-{crc32c.crc32c(device.encode()):08x}"


class DeviceCapacityKeeper:
    def __init__(self, kv: KeyValue, *, device: str, host_id: str, slots: int, claim_s: float = 120.0,
                 poll_s: float = 0.2, clock: Callable[[], float] = time.time) -> None:
        self.kv = kv
        self.device = device
        self.key = device_kv_key(device)
        self.host_id = host_id
        self.slots = slots
        self.claim_s = claim_s
        self.poll_s = poll_s
        self.clock = clock
        self.current: DeviceCapacity | None = None
        self.measured_here = False

    async def _read(self) -> tuple[DeviceCapacity | None, int]:
        try:
            e = await self.kv.get(self.key)
        except nats.js.errors.KeyNotFoundError:
            return None, 0
        return (decode(e.value, DeviceCapacity) if e.value else None), e.revision or 0

    async def _write(self, rec: DeviceCapacity, revision: int) -> int | None:
        """CAS: the new revision, or None if another host wrote first."""
        try:
            if revision == 0:
                return await self.kv.create(self.key, encode(rec))
            return await self.kv.update(self.key, encode(rec), last=revision)
        except (nats.js.errors.KeyWrongLastSequenceError, nats.js.errors.BadRequestError):
            return None

    async def obtain(self, shapes: set[str], measure: Measure) -> DeviceCapacity:
        """The device's record covering `shapes` (backend and config of every backend this host serves):
        adopted when a peer measured it, else measured here under the device's claim."""
        while True:
            rec, rev = await self._read()
            now = self.clock()
            if rec is not None and rec.state == "measured" and shapes <= {c.shape for c in rec.curves}:
                return await self._join(rec, rev)
            if rec is not None and rec.state == "measuring" and rec.until > now and rec.measured_by != self.host_id:
                await asyncio.sleep(self.poll_s)  # a peer is measuring the device: wait for its result
                continue
            base = rec or DeviceCapacity(device=self.device, slots=self.slots)
            claim = msgspec.structs.replace(base, state="measuring", measured_by=self.host_id,
                                            until=now + self.claim_s, updated_at=now)
            claimed = await self._write(claim, rev)
            if claimed is None:
                continue  # a peer claimed it first
            have = {c.shape for c in base.curves}
            rows, curves = await measure(shapes - have)
            done = msgspec.structs.replace(claim, state="measured", until=0.0, updated_at=self.clock(),
                                           rows=_merge_rows(base.rows, rows),
                                           hosts=sorted({*base.hosts, self.host_id}))
            for c in curves:
                done = cm.with_curve(done, c)
            if await self._write(done, claimed) is None:
                continue  # taken over (we overran the claim): read again
            self.measured_here = True
            log.info("device_capacity_measured", device=self.device, host_id=self.host_id,
                     curves=[(c.backend, c.tier, [(p.sessions, round(p.chunk_ms, 2)) for p in c.points])
                             for c in curves])
            self.current = done
            return done

    async def _join(self, rec: DeviceCapacity, rev: int) -> DeviceCapacity:
        """Adopt a measured record, adding this host to its hosts."""
        while self.host_id not in rec.hosts:
            joined = msgspec.structs.replace(rec, hosts=sorted({*rec.hosts, self.host_id}))
            if await self._write(joined, rev) is not None:
                rec = joined
                break
            got, rev = await self._read()
            if got is None:
                break
            rec = got
        self.current = rec
        return rec

    def rows_for(self, backends: set[str]) -> list[ProfileRow]:
        assert self.current is not None
        return [r for r in self.current.rows if r.backend in backends]

    async def refresh(self, observed: list[tuple[str, int, int, float, int]]) -> DeviceCapacity | None:
        """Fold serving's observations — (shape, tier, sessions, block_ms, blocks) — into the device's
        record by CAS, and take the record as it stands (its peers' refreshes included)."""
        for _ in range(3):
            rec, rev = await self._read()
            if rec is None or rec.state != "measured":
                return self.current
            new = rec
            for shape, tier, n, block_ms, blocks in observed:
                curve = next((c for c in new.curves if c.shape == shape and c.tier == tier), None)
                if curve is not None:
                    new = cm.with_curve(new, cm.observe(curve, n, block_ms, blocks))
            if new is rec:
                self.current = rec
                return rec
            new = msgspec.structs.replace(new, updated_at=self.clock())
            if await self._write(new, rev) is not None:
                self.current = new
                return new
        return self.current


def _merge_rows(old: list[ProfileRow], new: list[ProfileRow]) -> list[ProfileRow]:
    fresh = {(r.backend, r.tier) for r in new}
    return [*(r for r in old if (r.backend, r.tier) not in fresh), *new]
