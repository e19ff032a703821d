"""`statefleet status`: services, engine hosts and sessions as read from the bus's KV buckets."""

from __future__ import annotations

import os
import time
from pathlib import Path

import nats.js.errors

from libs import bus, names
from libs.schemas.base import decode
from libs.schemas.common import EngineEntry, ServiceEntry, SessionSummary
from statefleet import json_out


def default_nats_url() -> str:
    """SF_NATS_URL, else the URL `statefleet up` wrote to ./var/nats.url, else the standard port."""
    if url := os.environ.get("SF_NATS_URL"):
        return url
    written = Path("var/nats.url")
    if written.exists():
        return written.read_text().strip()
    return "nats://127.0.0.1:4222"


async def read_bucket(js, bucket: str, typ: type) -> list:
    try:
        kv = await js.key_value(bucket)
    except nats.js.errors.BucketNotFoundError:
        return []
    try:
        keys = await kv.keys()
    except nats.js.errors.NoKeysError:
        return []
    out = []
    for key in keys:
        try:
            entry = await kv.get(key)
        except nats.js.errors.KeyNotFoundError:
            continue  # expired between listing and reading
        if entry.value:
            out.append(decode(entry.value, typ))
    return out


async def fleet(nats_url: str) -> dict[str, list]:
    nc = await bus.connect(nats_url, name="statefleet-status")
    try:
        js = nc.jetstream()
        return {
            "services": await read_bucket(js, names.SERVICES_BUCKET, ServiceEntry),
            "engines": await read_bucket(js, names.ENGINES_BUCKET, EngineEntry),
            "sessions": await read_bucket(js, names.SESSIONS_BUCKET, SessionSummary),
        }
    finally:
        await nc.close()


async def print_status(nats_url: str, *, as_json: bool = False, all_sessions: bool = False) -> int:
    state = await fleet(nats_url or default_nats_url())
    if as_json:
        print(json_out.dumps(state))
        return 0
    now = time.time()
    print(f"services ({len(state['services'])})")
    for s in sorted(state["services"], key=lambda s: (s.service, s.instance)):
        print(f"  {s.service:<12} {s.instance:<24} v{s.version:<8} up {now - s.started_at:7.1f}s  "
              f"pid {s.pid}@{s.hostname}")
    print(f"engine hosts ({len(state['engines'])})")
    for e in sorted(state["engines"], key=lambda e: e.host_id):
        print(f"  {e.host_id:<12} {e.device:<8} mem {e.free_memory_bytes / 2**30:6.1f}/"
              f"{e.memory_bytes / 2**30:6.1f} GiB free  sessions {e.sessions}")
    shown = [s for s in state["sessions"] if all_sessions or s.state != "closed"]
    hidden = len(state["sessions"]) - len(shown)
    print(f"sessions ({len(shown)}" + (f"; {hidden} closed not shown, --all lists them)" if hidden else ")"))
    for s in sorted(shown, key=lambda s: s.session_id):
        owner = f"{s.owner_server_id}@v{s.owner_version}" + ("" if s.claimed else " (unclaimed)")
        print(f"  {s.session_id:<24} {s.backend:<8} {s.session_class:<4} {s.state:<10} owner {owner}")
    return 0
