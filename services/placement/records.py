"""The `sf_capacity` bucket's writes: every change to a host's record is a compare-and-set on its revision."""

from __future__ import annotations

from collections.abc import Callable

import nats.errors
import nats.js.errors
from nats.js.kv import KeyValue

from libs import errors
from libs.schemas.base import decode, encode
from libs.schemas.placement import HostRecord

MAX_CAS_ATTEMPTS = 32


class Records:
    def __init__(self, kv: KeyValue) -> None:
        self.kv = kv

    async def read(self, host_id: str) -> tuple[HostRecord, int]:
        """The record and its revision (0: none yet)."""
        try:
            entry = await self.kv.get(host_id)
        except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
            return HostRecord(host_id=host_id), 0
        return decode(entry.value, HostRecord), entry.revision

    async def swap(self, host_id: str, record: HostRecord, revision: int) -> bool:
        """Write `record` only if the stored one is still at `revision` (0: none yet); whether it was written."""
        try:
            if revision:
                await self.kv.update(host_id, encode(record), last=revision)
            else:
                await self.kv.create(host_id, encode(record))
            return True
        except nats.js.errors.KeyWrongLastSequenceError:
            return False
        except (nats.errors.TimeoutError, nats.errors.NoRespondersError) as e:
            raise errors.Unavailable(f"capacity record of {host_id} not written: {type(e).__name__}",
                                     host_id=host_id) from None

    async def change(self, host_id: str, fn: Callable[[HostRecord], HostRecord]) -> HostRecord:
        """Apply the pure `fn` to the current record and write the result if nothing changed the record
        since it was read; otherwise read and decide again. `fn` may raise to write nothing."""
        for _ in range(MAX_CAS_ATTEMPTS):
            record, revision = await self.read(host_id)
            new = fn(record)
            if new == record and revision:
                return record
            if await self.swap(host_id, new, revision):
                return new
        raise errors.Conflict(f"capacity record of {host_id} kept changing", host_id=host_id)
