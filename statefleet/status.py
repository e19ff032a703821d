"""`statefleet status`: services, engine hosts and sessions as read from the bus's KV buckets."""

from __future__ import annotations

import os
import time
from pathlib import Path

from libs import bus, names
from libs.contracts import Guard, device_key
from libs.schemas.base import decode
from libs.schemas.common import EngineEntry, ServiceEntry, SessionSummary
from libs.schemas.placement import HostRecord
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
    kv = await bus.bucket(js, bucket)
    if kv is None:
        return []
    return [decode(e.value, typ) for e in await bus.kv_entries(kv) if e.value]


async def fleet(nats_url: str) -> dict[str, list]:
    nc = await bus.connect(nats_url, name="statefleet-status")
    try:
        js = nc.jetstream()
        return {
            "services": await read_bucket(js, names.SERVICES_BUCKET, ServiceEntry),
            "engines": await read_bucket(js, names.ENGINES_BUCKET, EngineEntry),
            "sessions": await read_bucket(js, names.SESSIONS_BUCKET, SessionSummary),
            "hosts": await read_bucket(js, names.CAPACITY_BUCKET, HostRecord),
        }
    finally:
        await nc.close()


def host_states(engines: list[EngineEntry], records: list[HostRecord], now: float) -> dict[str, tuple[str, str]]:
    """host id → (up | draining | drained | dead, incarnation). A host is live while its heartbeat is younger
    than the missed beats placement allows; a host placement recorded without one is dead."""
    live = {e.host_id: e for e in engines
            if now - e.heartbeat_at <= names.HEARTBEAT_TTL_FACTOR * (e.heartbeat_s or 2.0)}
    recs = {r.host_id: r for r in records}
    out = {}
    for host_id in sorted(set(live) | set(recs)):
        e, r = live.get(host_id), recs.get(host_id)
        state = "dead" if e is None else (r.state if r else "up")
        out[host_id] = (state, e.incarnation if e else (r.incarnation if r else ""))
    return out


def device_loads(engines: list[EngineEntry], limit: float = 1.0 - Guard().busy_fraction) -> list[dict]:
    """One row per device (hosts sharing one split it, so their loads add up): the load admitted
    (`busy_fraction`, what admission budgets) and the load its hosts measured themselves running
    (`measured_fraction`), and whether the measured load is over admission's limit. An overload is
    said here whatever the model's prices claim."""
    groups: dict[str, list[EngineEntry]] = {}
    for e in engines:
        groups.setdefault(device_key(e), []).append(e)
    rows = []
    for key, hosts in sorted(groups.items()):
        measured = sum(h.measured_fraction for h in hosts)
        rows.append({"device": key, "hosts": sorted(h.host_id for h in hosts),
                     "admitted": sum(h.busy_fraction for h in hosts), "measured": measured, "limit": limit,
                     "over_capacity": measured > limit})
    return rows


def shown_state(s: SessionSummary, hosts: dict[str, tuple[str, str]]) -> str:
    """The summary's state, except that a session is never shown `serving` without a live owner process."""
    if s.state == "serving":
        state, incarnation = hosts.get(s.owner_server_id, ("dead", ""))
        if state == "dead" or s.owner_incarnation not in ("", incarnation):
            return "owner_dead"
    return s.state


async def print_status(nats_url: str, *, as_json: bool = False, all_sessions: bool = False) -> int:
    state = await fleet(nats_url or default_nats_url())
    now = time.time()
    hosts = host_states(state["engines"], state["hosts"], now)
    for s in state["sessions"]:
        s.state = shown_state(s, hosts)
    live = [e for e in state["engines"] if hosts.get(e.host_id, ("dead", ""))[0] != "dead"]
    devices = device_loads(live)
    if as_json:
        state["hosts"] = [{"host_id": h, "state": st, "incarnation": inc} for h, (st, inc) in hosts.items()]
        state["devices"] = devices
        print(json_out.dumps(state))
        return 0
    print(f"services ({len(state['services'])})")
    for s in sorted(state["services"], key=lambda s: (s.service, s.instance)):
        print(f"  {s.service:<12} {s.instance:<24} v{s.version:<8} up {now - s.started_at:7.1f}s  "
              f"pid {s.pid}@{s.hostname}" + (f"  metrics :{s.metrics_port}" if s.metrics_port >= 0 else ""))
    print(f"engine hosts ({len(hosts)})")
    engines = {e.host_id: e for e in state["engines"]}
    for host_id, (host_state, incarnation) in hosts.items():
        line = f"  {host_id:<12} {host_state:<9} incarnation {incarnation or '-':<17}"
        if (e := engines.get(host_id)) is not None and host_state != "dead":
            line += (f" {e.device:<8} mem {e.free_memory_bytes / 2**30:6.1f}/{e.memory_bytes / 2**30:6.1f} GiB free"
                     f"  sessions {e.sessions}")
        print(line)
    print(f"devices ({len(devices)})")
    for d in devices:
        print(f"  {d['device']:<40} hosts {','.join(d['hosts']):<20} load admitted {d['admitted']:.2f}"
              f"  measured {d['measured']:.2f} / limit {d['limit']:.2f}" + ("  OVER CAPACITY" if d["over_capacity"] else ""))
    shown = [s for s in state["sessions"] if all_sessions or s.state != "closed"]
    hidden = len(state["sessions"]) - len(shown)
    print(f"sessions ({len(shown)}" + (f"; {hidden} closed not shown, --all lists them)" if hidden else ")"))
    for s in sorted(shown, key=lambda s: s.session_id):
        owner = f"{s.owner_server_id}@v{s.owner_version}" + ("" if s.claimed else " (unclaimed)")
        print(f"  {s.session_id:<24} {s.backend:<8} {s.session_class:<4} {s.state:<10} owner {owner}"
              + (f"  {s.reason}" if s.reason else ""))
    return 0
