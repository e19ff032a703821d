"""The fleet as the dashboard shows it, kept live from the bus: a view, never authority.

It follows the engine hosts' heartbeats (`sf_engines`), the session summaries
(`sf_sessions`), admission's own records (placement decisions), the mover's
journal of moves in flight and its receipts, and reads admission's queue from
memory. Entries are kept as the plain dicts their writers sent, so fields other
parts add later (a host's incarnation or drain state) reach the page unchanged.
Every change bumps `version`; the socket handler sends a fresh snapshot when it
moved.
"""

from __future__ import annotations

import asyncio
import collections
import time
import weakref
from collections.abc import Callable
from typing import Any

import msgspec
from opentelemetry.metrics import CallbackOptions, Observation

from libs import bus, errors, names
from libs.telemetry import meter

KEPT_EVENTS = 60
KEPT_RECEIPTS = 20
DEAD_KEPT_S = 120.0  # a host whose heartbeat stopped is shown as dead this long, then dropped
_BULKY = ("profile",)  # per-host fields too big and too internal for the page
# The feeds of this process's running admission instances: the gauges (registered once per process,
# as instruments are) read from these, so a stopped instance's view is never reported.
_live: weakref.WeakSet[FleetFeed] = weakref.WeakSet()
_gauges_registered = False


class FleetFeed:
    def __init__(self, nc: bus.Client, js: bus.JetStream, *, queue: Callable[[], Any], heartbeat_s: float) -> None:
        self.nc, self.js, self.queue, self.heartbeat_s = nc, js, queue, heartbeat_s
        self.hosts: dict[str, dict] = {}
        self.lifecycle: dict[str, str] = {}  # placement's host records: up, draining, drained
        self.sessions: dict[str, dict] = {}
        self.inflight: dict[str, dict] = {}
        self.receipts: collections.deque[dict] = collections.deque(maxlen=KEPT_RECEIPTS)
        self.events: collections.deque[dict] = collections.deque(maxlen=KEPT_EVENTS)
        self.version = 0

    async def start(self, spawn: Callable) -> None:
        _register_gauges()
        _live.add(self)
        for bucket, apply in ((names.ENGINES_BUCKET, self._host), (names.SESSIONS_BUCKET, self._session),
                              (names.ADMISSION_BUCKET, self._record), (names.MOVES_INFLIGHT_BUCKET, self._move),
                              (names.CAPACITY_BUCKET, self._lifecycle)):
            spawn(self._follow(bucket, apply), f"feed:{bucket}")
        await self.nc.subscribe(names.MOVE_RECEIPT_SUBJECTS, cb=self._on_receipt)

    # ------------------------------------------------------------ the page's view

    def snapshot(self, now: float | None = None) -> dict:
        now = time.time() if now is None else now
        stale = now - self.heartbeat_s * names.HEARTBEAT_TTL_FACTOR
        hosts = []
        for host_id, h in sorted(self.hosts.items()):
            if h.get("deleted") or h.get("heartbeat_at", 0.0) < stale:
                if now - h.get("heartbeat_at", 0.0) > DEAD_KEPT_S:
                    continue
                state = "dead"
            else:
                state = self.lifecycle.get(host_id, "up")
            mem, free = h.get("memory_bytes", 0), h.get("free_memory_bytes", 0)
            hosts.append({**h, "host_id": host_id, "state": state,
                          "memory_used_fraction": (mem - free) / mem if mem else 0.0,
                          "heartbeat_age_s": max(0.0, now - h.get("heartbeat_at", now))})
        return {"at": now, "hosts": hosts,
                "sessions": sorted(self.sessions.values(), key=lambda s: s.get("session_id", "")),
                "moves_in_flight": list(self.inflight.values()), "receipts": list(self.receipts),
                "events": list(self.events), "queue": msgspec.to_builtins(self.queue())}

    def stop(self) -> None:
        _live.discard(self)

    def _changed(self) -> None:
        self.version += 1

    def _event(self, kind: str, text: str, **fields: Any) -> None:
        self.events.appendleft({"at": time.time(), "kind": kind, "text": text, **fields})

    # ------------------------------------------------------------ following the bus

    async def _follow(self, bucket: str, apply: Callable[[str, dict | None], None]) -> None:
        """Watch one bucket for as long as the service runs; a bucket not made yet is waited for."""
        while True:
            try:
                kv = await bus.bucket(self.js, bucket)
                if kv is None:
                    raise errors.Unavailable(f"no bucket {bucket} yet", bucket=bucket)
                watcher = await bus.watch(kv)
                while True:
                    entry = await bus.next_update(watcher, 30.0)
                    if entry is None:
                        continue  # caught up with what the bucket held
                    deleted = entry.operation in ("DEL", "PURGE") or not entry.value
                    try:
                        value = None if deleted else msgspec.msgpack.decode(entry.value)
                    except msgspec.DecodeError:
                        continue
                    apply(entry.key, value if isinstance(value, dict) or value is None else None)
                    self._changed()
            except errors.StatefleetError:
                await asyncio.sleep(self.heartbeat_s)  # no bucket yet, or the bus is away: look again

    def _lifecycle(self, key: str, value: dict | None) -> None:
        state = "up" if value is None else value.get("state", "up")
        if state != self.lifecycle.get(key, "up"):
            self._event("host", f"{key} {state}", host_id=key)
        self.lifecycle[key] = state
        self.version += 1

    def _host(self, key: str, value: dict | None) -> None:
        before = self.hosts.get(key)
        if value is None:
            if before is not None:
                before["deleted"] = True
                self._event("host", f"{key} left")
            return
        for field in _BULKY:
            value.pop(field, None)
        if before is None or before.get("deleted"):
            self._event("host", f"{key} is up on {value.get('device', '?')}", host_id=key)
        elif value.get("incarnation") not in (None, before.get("incarnation")):
            self._event("host", f"{key} restarted (incarnation {value['incarnation']})", host_id=key)
        self.hosts[key] = value

    def _session(self, key: str, value: dict | None) -> None:
        if value is None or value.get("state") == "closed":
            self.sessions.pop(key, None)
            return
        before = self.sessions.get(key, {})
        if (before.get("owner_server_id"), before.get("owner_version")) != \
                (value.get("owner_server_id"), value.get("owner_version")) and value.get("owner_server_id"):
            self._event("owner", f"{key[:8]} owner {value['owner_server_id']} v{value.get('owner_version')}",
                        session_id=key)
        shed = value.get("shed") or ""
        if shed != (before.get("shed") or ""):  # overload relief suspended it (capacity_lost: re-queued), or it is back
            self._event("shed", f"{key[:8]} {shed}: {value.get('reason', '')}" if shed else f"{key[:8]} resumed",
                        session_id=key, shed=shed)
        self.sessions[key] = value

    def _record(self, key: str, value: dict | None) -> None:
        """Admission's decisions: placed on a host, queued, timed out."""
        if value is None:
            return
        state, host = value.get("state"), value.get("host_id", "")
        detail = f" on {host}" if state == "placed" and host else ""
        self._event("placement", f"{key[:8]} {state}{detail}", session_id=key, state=state, host_id=host)

    def _move(self, key: str, value: dict | None) -> None:
        if value is None:
            self.inflight.pop(key, None)
            return
        self.inflight[key] = value
        self._event("move", f"{value.get('session_id', '?')[:8]} moving {value.get('source')} → "
                            f"{value.get('dest')}", move_id=key)

    async def _on_receipt(self, msg) -> None:
        try:
            receipt = msgspec.msgpack.decode(msg.data)
        except msgspec.DecodeError:
            return
        if not isinstance(receipt, dict):
            return
        self.receipts.appendleft(receipt)
        outcome, reason = receipt.get("outcome", "?"), receipt.get("reason", "")
        verdict = "bit-identical" if outcome == "committed" else f"failed closed: {reason}" if reason else outcome
        self._event("receipt", f"{receipt.get('session_id', '?')[:8]} {receipt.get('source')} → "
                               f"{receipt.get('dest')}: {outcome} ({verdict})", move_id=receipt.get("move_id"))
        self._changed()


def _register_gauges() -> None:
    """The fleet as Prometheus gauges (read when scraped), for the Grafana dashboard in compose/."""
    global _gauges_registered
    if _gauges_registered:
        return
    _gauges_registered = True
    m = meter()

    def per_host(field: str):
        def observe(_: CallbackOptions):
            return [Observation(float(h.get(field) or 0.0), {"host_id": h["host_id"], "state": h["state"]})
                    for feed in list(_live) for h in feed.snapshot()["hosts"]]
        return observe

    for name, field, what in (("sf_fleet_host_sessions", "sessions", "Sessions on an engine host"),
                              ("sf_fleet_host_busy_fraction", "busy_fraction",
                               "Share of an engine host's device time its sessions take"),
                              ("sf_fleet_host_memory_used_fraction", "memory_used_fraction",
                               "Share of an engine host's device memory in use")):
        m.create_observable_gauge(name, callbacks=[per_host(field)], description=what)
    m.create_observable_gauge("sf_fleet_moves_in_flight", description="Moves journalled and not yet over",
                              callbacks=[lambda _: [Observation(sum(len(f.inflight) for f in list(_live)))]])
    m.create_observable_gauge("sf_admission_queue_length", description="Sessions waiting in admission's queue",
                              callbacks=[lambda _: [Observation(sum(len(f.queue().entries) for f in list(_live)))]])
