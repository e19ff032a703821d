"""A lease held by compare-and-set on one KV key: which placement instance acts as the fleet controller.

The holder renews it every round; anyone may take it once it has expired (by the expiry the
record itself carries). Every write is a create or an update on the revision just read, so of
two instances that race for an expired lease exactly one write lands. The holder stops acting
`margin_s` before its own expiry, measured from before the renewing write was sent: a renewal
that is slow to land never stretches the time it counts as held.
"""

from __future__ import annotations

import time

import nats.errors
import nats.js.errors
from nats.js.kv import KeyValue

from libs.schemas.base import decode, encode
from libs.schemas.placement import Lease

_LOST = (nats.js.errors.KeyWrongLastSequenceError, nats.js.errors.BadRequestError)
_UNREACHABLE = (nats.errors.TimeoutError, nats.errors.NoRespondersError, nats.errors.ConnectionClosedError)


class KvLease:
    def __init__(self, kv: KeyValue, key: str, holder: str, *, ttl_s: float, margin_s: float) -> None:
        self.kv, self.key, self.holder = kv, key, holder
        self.ttl_s, self.margin_s = ttl_s, margin_s
        self._valid_until = 0.0  # monotonic

    @property
    def held(self) -> bool:
        return time.monotonic() < self._valid_until

    async def renew(self) -> bool:
        """Take or renew the lease; True while this instance holds it."""
        sent = time.monotonic()
        try:
            current, revision = await self._read()
            if current is not None and current.holder != self.holder and current.expires_at > time.time():
                self._valid_until = 0.0
                return False
            value = encode(Lease(holder=self.holder, expires_at=time.time() + self.ttl_s))
            if revision:
                await self.kv.update(self.key, value, last=revision)
            else:
                await self.kv.create(self.key, value)
        except _LOST:  # another instance wrote first
            self._valid_until = 0.0
            return False
        except _UNREACHABLE:
            return self.held  # what we held stays held until it runs out; then we stop acting
        self._valid_until = sent + self.ttl_s - self.margin_s
        return True

    async def give_up(self) -> None:
        """Hand the lease back at once (a clean stop), so the other instance need not wait for it to expire."""
        if not self.held:
            return
        self._valid_until = 0.0
        try:
            current, revision = await self._read()
            if current is not None and current.holder == self.holder:
                await self.kv.update(self.key, encode(Lease(holder="", expires_at=0.0)), last=revision)
        except (*_LOST, *_UNREACHABLE):
            pass

    async def _read(self) -> tuple[Lease | None, int]:
        try:
            entry = await self.kv.get(self.key)
        except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
            return None, 0
        return decode(entry.value, Lease), entry.revision
