"""The fleet controller's tenure: which placement instance acts as the controller, held by
compare-and-set on one KV key (a lease on that role, named apart from the engine hosts' session leases).

The holder renews it every round; anyone may take it once it has expired (by the expiry the
record itself carries). Every write is a create or an update on the revision just read, so of
two instances that race for an expired tenure exactly one write lands. The holder stops acting
`margin_s` before its own expiry, measured from before the renewing write was sent: a renewal
that is slow to land never stretches the time it counts as held.
"""

from __future__ import annotations

import time

from libs import bus
from libs.errors import Unavailable
from libs.schemas.base import decode, encode
from libs.schemas.placement import Tenure


class KvTenure:
    def __init__(self, kv: bus.KeyValue, key: str, holder: str, *, ttl_s: float, margin_s: float) -> None:
        self.kv, self.key, self.holder = kv, key, holder
        self.ttl_s, self.margin_s = ttl_s, margin_s
        self._valid_until = 0.0  # monotonic

    @property
    def held(self) -> bool:
        return time.monotonic() < self._valid_until

    async def renew(self) -> bool:
        """Take or renew the tenure; True while this instance holds it."""
        sent = time.monotonic()
        try:
            current, revision = await self._read()
            if current is not None and current.holder != self.holder and current.expires_at > time.time():
                self._valid_until = 0.0
                return False
            value = encode(Tenure(holder=self.holder, expires_at=time.time() + self.ttl_s))
            written = await bus.kv_swap(self.kv, self.key, value, revision)
        except Unavailable:
            return self.held  # what we held stays held until it runs out; then we stop acting
        if not written:  # another instance wrote first
            self._valid_until = 0.0
            return False
        self._valid_until = sent + self.ttl_s - self.margin_s
        return True

    async def give_up(self) -> None:
        """Hand the tenure back at once (a clean stop), so the other instance need not wait for it to expire."""
        if not self.held:
            return
        self._valid_until = 0.0
        try:
            current, revision = await self._read()
            if current is not None and current.holder == self.holder:
                await bus.kv_swap(self.kv, self.key, encode(Tenure(holder="", expires_at=0.0)), revision)
        except Unavailable:
            pass  # it runs out by itself

    async def _read(self) -> tuple[Tenure | None, int]:
        entry = await bus.kv_read(self.kv, self.key)
        if entry is None:
            return None, 0
        return decode(entry.value or b"", Tenure), entry.revision or 0
