"""One start-up profile per device: the first host of a device measures, its peers use those rows.

Hosts that share a device (`statefleet up` starts two on one machine's CPU) profiled each as if
alone and all at once, so each one's rows were taken beside the others' profiling blocks: noise that
differed host by host, and a device priced twice over by two curves. Now a host claims the device's
key in `sf_device_profiles` (a create, so exactly one wins), measures, and publishes its rows there;
a host that finds the key claimed waits for those rows (bounded: a claimer that died leaves a claim the
bucket's TTL clears, and the waiter measures itself after `wait_s`; a host that finds its own claim,
having restarted mid-measurement, takes it over at once) and serves with them. The key
covers what the rows depend on besides the device: the backends and their configs, and the host's
torch thread count, and the host processes the device's curve was measured across (`spread.py`).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Callable, Iterable

import msgspec

from libs import bus
from libs.bus import failures
from libs.schemas.common import ProfileRow

CLAIM = b"measuring:"  # + the claiming host's id: a claim, not rows yet
_ROWS = msgspec.msgpack.Decoder(list[ProfileRow])


def device_profile_key(machine: str, device: str, shapes: Iterable[str], threads: int, *, processes: int = 1) -> str:
    """A KV-safe key naming the device and what its rows depend on (`costs.shape_of` per backend, and how
    many host processes the curve was spread over)."""
    text = "\n".join([machine, device, str(threads), *sorted(shapes)] + ([f"processes={processes}"] if processes > 1 else []))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


async def shared_rows(kv: bus.KeyValue, key: str, host_id: str, measure: Callable[[], Awaitable[list[ProfileRow]]],
                      *, wait_s: float, poll_s: float = 0.2) -> tuple[list[ProfileRow], bool]:
    """(the device's rows, whether this host measured them). A claim of this host's own (it restarted
    while measuring) is taken over at once, not waited out. A host whose machine has no identity (no
    boot id) must not share: it measures alone without calling this."""
    mine = CLAIM + host_id.encode()
    loop = asyncio.get_running_loop()
    until = loop.time() + wait_s
    claimed = await bus.kv_swap(kv, key, mine, 0)
    while not claimed and loop.time() < until:
        entry = await bus.kv_read(kv, key)
        value = entry.value if entry is not None else None
        if not value:  # expired or purged: claim it afresh
            claimed = await bus.kv_swap(kv, key, mine, 0)
        elif value == mine:
            claimed = True
        elif not value.startswith(CLAIM):
            return _ROWS.decode(value), False
        else:
            await asyncio.sleep(poll_s)
    rows = await measure()
    if claimed:
        with failures.unavailable(f"device profile {key} not published"):
            await kv.put(key, msgspec.msgpack.encode(rows))
    return rows, True
