"""The host's backends (one per name and config) and what a quantum of each costs on this device."""

from __future__ import annotations

import threading
from collections.abc import Callable

import crc32c
import torch

from services.engine_host.backends import Backend, Registry, make_backend
from services.engine_host.backends.base import forward_passes

COST_EWMA = 0.2


def shape_of(backend: Backend) -> str:
    """Quanta of equal shape (backend and its config) can share a batched forward."""
    return f"{backend.name}:{crc32c.crc32c(backend.config_bytes()):08x}"


class Backends:
    """Builds each (name, config) backend once, from the registry; a name alone means the host's
    configured default. The one instance (its weights, shared modules) serves every session of
    that config on this host."""

    def __init__(self, device: torch.device, configs: dict[str, bytes], registry: Registry,
                 on_build: Callable[[Backend], None] = lambda b: None) -> None:
        self.device = device
        self.configs = configs
        self.registry = registry
        self.on_build = on_build
        self._built: dict[tuple[str, bytes], Backend] = {}
        self._lock = threading.Lock()  # built from the loop and from worker threads (profile, restore)

    def get(self, name: str, config: bytes | None = None) -> Backend:
        cfg = self.configs.get(name, b"") if config is None else config
        key = (name, cfg)
        with self._lock:
            if key not in self._built:
                self._built[key] = backend = make_backend(self.registry, name, cfg, self.device)
                self.on_build(backend)
            return self._built[key]


class CostModel:
    """Seconds per quantum by (shape, tier, batch size): seeded from the start-up profile, then
    learned from every quantum that finished (an EWMA, so it follows a device that slows down)."""

    def __init__(self) -> None:
        self._seconds: dict[tuple[str, int, int], float] = {}
        self._passes: dict[str, Callable[[int], int]] = {}
        self._profiled: dict[tuple[str, int], float] = {}  # the start-up profile's block, kept as a floor

    def shape(self, backend: Backend) -> None:
        """Know a shape's forward passes per tier, so a tier not measured yet is priced from one that was."""
        self._passes[shape_of(backend)] = lambda tier: forward_passes(backend, tier)

    def estimate(self, shape: str, tier: int, n: int) -> float:
        """Measured for this batch size, else n × the single block, else n × another measured tier's
        single block scaled by forward passes (a clean pass costs as much as a step); 0 before
        anything is known."""
        if (c := self._seconds.get((shape, tier, n))) is not None:
            return c
        if (c := self._seconds.get((shape, tier, 1))) is not None:
            return c * n
        passes = self._passes.get(shape)
        known = [(t, s) for (sh, t, k), s in self._seconds.items() if sh == shape and k == 1]
        if passes is None or not known:
            return 0.0
        t0, s0 = max(known)
        return s0 * passes(tier) / passes(t0) * n

    def seed(self, shape: str, tier: int, seconds: float) -> None:
        """A single block's start-up estimate; never overrides what was already learned."""
        self._seconds.setdefault((shape, tier, 1), seconds)
        self._profiled.setdefault((shape, tier), seconds)

    def price(self, shape: str, tier: int) -> float:
        """What one session's block is budgeted at (admission's price, the heartbeat's load): the learned
        cost, never below the start-up profile's. Blocks of one or two sessions on a quiet device run
        faster than that profile (taken while every host of the device profiled at once), and that
        cheaper cost does not hold once the sessions it would admit run beside them: priced so, a burst
        of sixteen was admitted where the start-up rows had room for four (docs/decisions.md, issue 23)."""
        return max(self.estimate(shape, tier, 1), self._profiled.get((shape, tier), 0.0))

    def learn(self, shape: str, tier: int, n: int, seconds: float) -> None:
        key = (shape, tier, n)
        old = self._seconds.get(key)
        self._seconds[key] = seconds if old is None else (1 - COST_EWMA) * old + COST_EWMA * seconds
