"""The `sf_capacity` bucket's reads and writes: every change to a host's record is a compare-and-set on
its revision. Only `reservations.Reservations` calls this (the bucket's one writer)."""

from __future__ import annotations

from collections.abc import Callable

from libs import bus, errors
from libs.schemas.base import decode, encode
from libs.schemas.placement import HostRecord


class Records:
    def __init__(self, kv: bus.KeyValue) -> None:
        self._kv = kv

    async def read(self, host_id: str) -> tuple[HostRecord, int]:
        """The record and its revision (0: none yet)."""
        entry = await bus.kv_read(self._kv, host_id)
        if entry is None:
            return HostRecord(host_id=host_id), 0
        return decode(entry.value or b"", HostRecord), entry.revision or 0

    async def swap(self, host_id: str, record: HostRecord, revision: int) -> bool:
        """Write `record` only if the stored one is still at `revision` (0: none yet); whether it was written."""
        return await bus.kv_swap(self._kv, host_id, encode(record), revision)

    async def change(self, host_id: str, fn: Callable[[HostRecord], HostRecord]) -> HostRecord:
        """Apply the pure `fn` to the current record and write the result if nothing changed the record
        since it was read; otherwise read and decide again. `fn` may raise to write nothing."""
        for _ in range(bus.MAX_CAS_ATTEMPTS):
            record, revision = await self.read(host_id)
            new = fn(record)
            if new == record and revision:
                return record
            if await self.swap(host_id, new, revision):
                return new
        raise errors.Conflict(f"capacity record of {host_id} kept changing", host_id=host_id)
