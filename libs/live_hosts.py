"""The engine hosts alive now, as their heartbeats in the `sf_engines` bucket say.

A host is live while its latest heartbeat is younger than the bucket's TTL
(`heartbeat_s * HEARTBEAT_TTL_FACTOR`). Age alone decides: a listing may still
show keys the TTL has expired, and an expiry raises no watch event. Admission
follows the bucket with a watch (it wakes its queue on every change).

Placement does not use this view, and the two rules differ on purpose: admission only asks which
hosts it may offer a new session to now (a heartbeat younger than the TTL), while placement declares
processes dead and fails their sessions over (`services/placement/liveness.py`): silence counted
against each host's own interval, a new incarnation as a death, and a bus outage or a fleet-wide
silence never read as deaths. A host admission skips for a stale beat costs a retry; a death
placement declares wrongly costs a failover, so only placement needs the stricter rule.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import structlog

from libs import bus, errors, names
from libs.errors import SchemaError
from libs.schemas.base import decode
from libs.schemas.common import EngineEntry


class LiveHosts:
    def __init__(self, kv: bus.KeyValue, heartbeat_s: float, log: structlog.typing.FilteringBoundLogger) -> None:
        self.kv = kv
        self.heartbeat_s = heartbeat_s
        self.max_age_s = heartbeat_s * names.HEARTBEAT_TTL_FACTOR
        self.log = log
        self._followed: dict[str, EngineEntry] = {}
        self._watcher = None

    @classmethod
    async def open(cls, js: bus.JetStream, *, heartbeat_s: float, replicas: int,
                   log: structlog.typing.FilteringBoundLogger) -> LiveHosts:
        """The view on the engines bucket (created with its TTL if it is not there yet)."""
        kv = await bus.ensure_kv(js, names.ENGINES_BUCKET, ttl_s=heartbeat_s * names.HEARTBEAT_TTL_FACTOR,
                                 replicas=replicas)
        return cls(kv, heartbeat_s, log)

    def _fresh(self, hosts: list[EngineEntry]) -> list[EngineEntry]:
        oldest = time.time() - self.max_age_s
        return [h for h in hosts if h.heartbeat_at >= oldest]

    def _decode(self, key: str, value: bytes) -> EngineEntry | None:
        try:
            return decode(value, EngineEntry)
        except SchemaError as e:
            self.log.warning("engine_entry_undecodable", host_id=key, detail=e.detail)
            return None

    # -------------------------------------------------------------- a followed view (admission)

    async def watch(self) -> None:
        """Start watching the bucket; call before anything reads `followed`, so no update is missed."""
        self._watcher = await bus.watch(self.kv)

    def followed(self) -> list[EngineEntry]:
        """Every live host as the watch has delivered them so far."""
        return self._fresh(list(self._followed.values()))

    async def follow(self, on_change: Callable[[], None], silence_s: float) -> None:
        """Keep `followed` current (calling `on_change` after each update) until cancelled.

        Engines beat every few seconds, so a watch silent for longer than `silence_s` is
        re-opened: an ordered consumer does not outlive a server restart.
        """
        while True:
            try:
                await self._follow(on_change, silence_s)
            except errors.StatefleetError as e:  # silent for too long (a lost server), or the watch broke
                self.log.info("engine_watch_reopen", reason=e.code)
            await bus.quietly(self._watcher.stop())
            try:
                self._watcher = await bus.watch(self.kv)
            except errors.Unavailable as e:  # the bus is down: try again shortly
                self.log.warning("engine_watch_failed", error=e.detail)
                await asyncio.sleep(self.heartbeat_s)

    async def _follow(self, on_change: Callable[[], None], silence_s: float) -> None:
        while True:
            entry = await bus.next_update(self._watcher, silence_s)
            if entry is None:
                continue  # the "caught up" marker
            if entry.operation in ("DEL", "PURGE") or not entry.value:
                self._followed.pop(entry.key, None)
            else:
                host = self._decode(entry.key, entry.value)
                if host is None:
                    continue
                self._followed[entry.key] = host
            on_change()
