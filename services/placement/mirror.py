"""A KV bucket mirrored in memory through a watch: the latest decoded value of every key.

What it holds is a hint (decisions are compare-and-set writes elsewhere). The watch is an
ordered consumer, which does not outlive a server restart, so it is re-opened (replaying
every key's latest value) after the connection was lost, or after `silence_s` without news.
`current` says whether the mirror is following the bucket now: after a lost connection it
is not, until the re-opened watch has caught up, so silence seen through it means nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Generic, TypeVar

import structlog

from libs import bus
from libs.errors import StatefleetError, Timeout, Unavailable
from libs.schemas.base import decode

M = TypeVar("M")
CHECK_S = 0.25  # how often a quiet watch checks whether the connection was lost meanwhile
_log = structlog.get_logger("statefleet.placement.mirror")


class KvMirror(Generic[M]):
    """`on_change(key, value)` runs for every update (value None for a delete) after `values` has it."""

    def __init__(self, nc: bus.Client, kv: bus.KeyValue, typ: type[M], *, silence_s: float,
                 on_change: Callable[[str, M | None], None] | None = None) -> None:
        self.nc, self.kv, self.typ, self.silence_s = nc, kv, typ, silence_s
        self.on_change = on_change
        self.values: dict[str, M] = {}
        self.ready = asyncio.Event()  # set once the first watch has delivered every existing key
        self._caught_up = False  # the current watch has delivered every existing key
        self._reconnects = -1  # the connection's reconnect count when the current watch opened

    def wrote(self, key: str, value: M) -> None:
        """A value this process has just written: held now rather than once the watch delivers it, so
        this process's next decision sees its own last one. (A delivery of an older value may briefly
        show meanwhile; what the mirror holds is a hint either way.)"""
        self.values[key] = value

    @property
    def current(self) -> bool:
        return self._caught_up and self.nc.is_connected and self.nc.stats["reconnects"] == self._reconnects

    async def run(self) -> None:
        while True:
            self._caught_up = False
            self._reconnects = self.nc.stats["reconnects"]
            try:
                watcher = await bus.watch(self.kv)
            except Unavailable as e:  # the bus is down: try again shortly
                _log.warning("kv_watch_failed", bucket=self.kv._name, error=e.detail)
                await asyncio.sleep(self.silence_s)
                continue
            try:
                await self._follow(watcher)
            except Timeout:
                _log.debug("kv_watch_reopen", bucket=self.kv._name)  # quiet, or the connection was lost
            except Unavailable as e:
                _log.info("kv_watch_reopen", bucket=self.kv._name, reason=e.detail)
            finally:
                await bus.quietly(watcher.stop())

    async def _follow(self, watcher: bus.KeyWatcher) -> None:
        quiet = 0.0
        while True:
            try:
                entry = await bus.next_update(watcher, CHECK_S)
            except Timeout:
                quiet += CHECK_S
                if quiet >= self.silence_s or self.nc.stats["reconnects"] != self._reconnects:
                    raise
                continue
            quiet = 0.0
            if entry is None:
                self._caught_up = True  # the "caught up" marker
                self.ready.set()
                continue
            value = None
            if entry.operation not in ("DEL", "PURGE") and entry.value:
                try:
                    value = decode(entry.value, self.typ)
                except StatefleetError as e:
                    _log.warning("kv_entry_undecodable", bucket=self.kv._name, key=entry.key, detail=e.detail)
                    continue
            if value is None:
                self.values.pop(entry.key, None)
            else:
                self.values[entry.key] = value
            if self.on_change is not None:
                self.on_change(entry.key, value)
