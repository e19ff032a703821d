"""`statefleet backends`: what each live engine host can serve, read from its heartbeat in `sf_engines`.

The CLI never imports a backend: each host resolves its own `statefleet.backends` entry points
and lists them (with their tiers, input kinds and per-session state by role) in its heartbeat.
"""

from __future__ import annotations

import json

import msgspec

from libs import bus, names
from libs.schemas.common import EngineEntry
from statefleet.status import default_nats_url, read_bucket


async def host_backends(nats_url: str) -> list[EngineEntry]:
    nc = await bus.connect(nats_url, name="statefleet-backends")
    try:
        entries = await read_bucket(nc.jetstream(), names.ENGINES_BUCKET, EngineEntry)
        return sorted(entries, key=lambda e: e.host_id)
    finally:
        await nc.close()


async def print_backends(nats_url: str, *, as_json: bool = False) -> int:
    entries = await host_backends(nats_url or default_nats_url())
    if as_json:
        print(json.dumps({e.host_id: msgspec.to_builtins(e.backends) for e in entries}, indent=2))
        return 0
    for e in entries:
        print(f"{e.host_id} {e.device}")
        for b in e.backends:
            print(f"  {b.name:<10} tiers {','.join(map(str, b.tiers)):<10} inputs {','.join(b.input_kinds):<12} "
                  f"starts from {','.join(b.init_kinds):<13} "
                  f"moved {b.moved_bytes / 2**20:9.2f} MiB  rebuildable {b.rebuildable_bytes / 2**20:9.2f} MiB  "
                  f"static {b.static_bytes / 2**20:8.2f} MiB  {b.source}")
    return 0
