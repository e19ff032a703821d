"""Key-value reads, compare-and-set writes, listings, watches and purges; nats-py's errors become ours."""

from __future__ import annotations

import asyncio
from typing import Any

from libs import errors
from libs.bus import failures
from libs.bus.types import JetStream, KeyValue, KeyWatcher, KvEntry

# How often a compare-and-set writer (log append, KV update, input store) re-reads and decides
# again after losing a race before it gives up with `Conflict`: far above what real contention needs.
MAX_CAS_ATTEMPTS = 32


async def bucket(js: JetStream, name: str) -> KeyValue | None:
    """The key-value bucket (None: it was never created)."""
    return await failures.unless_missing(js.key_value(name), lambda e: failures.failed(e, f"opening bucket {name}"))


async def kv_entries(kv: KeyValue) -> list[KvEntry]:
    """The latest entry of every key in the bucket, deleted and purged keys left out, read now.
    A bus failure is `Unavailable`.

    Not `KeyValue.keys()`: nats-py lists keys with a watcher whose first pass ends by pending counts, and
    a key rewritten during that pass can be left out, or the listing come back empty (NoKeysError) for a
    bucket that has keys: 20 of 413 listings of a three-key bucket were wrong while one key was rewritten
    in a loop, as heartbeats rewrite theirs (2026-12-01). The server lists a stream's subjects in one step
    (`STREAM.INFO` with a subject filter; up to 100,000 in one reply). The bucket's stream and subject
    prefix are the handle's own (nats-py keeps them as `_stream` and `_pre`)."""
    prefix = kv._pre
    with failures.unavailable("kv listing not read"):
        info = await kv._js.stream_info(kv._stream, subjects_filter=f"{prefix}>")
    out = []
    for subject in sorted(info.state.subjects or {}):
        entry = await kv_read(kv, subject.removeprefix(prefix))
        if entry is not None:  # else deleted, purged, or expired since the listing
            out.append(entry)
    return out


async def kv_read(kv: KeyValue, key: str) -> KvEntry | None:
    """The key's latest entry; None when it has none (never written, deleted, purged). A bus failure is
    `Unavailable`."""
    return await failures.unless_missing(kv.get(key), lambda e: failures.lost(e, f"kv {key} not read"))


async def kv_swap(kv: KeyValue, key: str, value: bytes, revision: int) -> bool:
    """Write `value` only if the key is still at `revision` (0: it has none yet): whether it was written
    (False: another write came first; read again and decide again). A bus failure is `Unavailable`."""
    try:
        if revision:
            await kv.update(key, value, last=revision)
        else:
            await kv.create(key, value)
        return True
    except failures.BUS_ERRORS as e:
        if failures.is_wrong_last(e):
            return False
        raise failures.lost(e, f"kv {key} not written") from None


async def purge_key(kv: KeyValue, key: str, *, what: str, **fields: Any) -> None:
    """Remove the key and its history from the bucket."""
    try:
        await kv.purge(key)
    except failures.BUS_ERRORS as e:
        raise failures.unanswered(e, f"purging {what}", **fields) from None


async def watch(kv: KeyValue) -> KeyWatcher:
    """A watcher of every key (its history first, then None, then updates). A bus failure is `Unavailable`."""
    with failures.unavailable("kv watch not opened"):
        return await kv.watchall()


async def next_update(watcher: KeyWatcher, timeout_s: float) -> KvEntry | None:
    """The watcher's next entry (None: the "caught up" marker); `errors.Timeout` when none came within
    `timeout_s`, `Unavailable` when the watch broke. Unlike `watcher.updates(timeout)`, a cancellation
    is never lost (see libs/tasks.py)."""
    try:
        async with asyncio.timeout(timeout_s):
            return await anext(watcher)
    except TimeoutError:
        raise errors.Timeout(f"no kv update within {timeout_s:g}s") from None
    except failures.BUS_ERRORS as e:
        raise failures.lost(e, "kv watch broke") from None
