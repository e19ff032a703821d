"""The host's backends (one per name and config) and what a quantum of each costs on this device."""

from __future__ import annotations

import crc32c
import torch

from services.engine_host.backends import Backend, make_backend

COST_EWMA = 0.2


def shape_of(backend: Backend) -> str:
    """Quanta of equal shape (backend and its config) can share a batched forward."""
    return f"{backend.name}:{crc32c.crc32c(backend.config_bytes()):08x}"


class Backends:
    """Builds each (name, config) backend once; a name alone means the host's configured default."""

    def __init__(self, device: torch.device, configs: dict[str, bytes]) -> None:
        self.device = device
        self.configs = configs
        self._built: dict[tuple[str, bytes], Backend] = {}

    def get(self, name: str, config: bytes | None = None) -> Backend:
        cfg = self.configs.get(name, b"") if config is None else config
        key = (name, cfg)
        if key not in self._built:
            self._built[key] = make_backend(name, cfg, self.device)
        return self._built[key]


class CostModel:
    """Seconds per quantum by (shape, tier, batch size): seeded from the start-up profile, then
    learned from every quantum that finished (an EWMA, so it follows a device that slows down)."""

    def __init__(self) -> None:
        self._seconds: dict[tuple[str, int, int], float] = {}

    def estimate(self, shape: str, tier: int, n: int) -> float:
        """Measured for this batch size, else n × the single block (0 before anything is known)."""
        if (c := self._seconds.get((shape, tier, n))) is not None:
            return c
        return self._seconds.get((shape, tier, 1), 0.0) * n

    def seed(self, shape: str, tier: int, seconds: float) -> None:
        """A single block's start-up estimate; never overrides what was already learned."""
        self._seconds.setdefault((shape, tier, 1), seconds)

    def learn(self, shape: str, tier: int, n: int, seconds: float) -> None:
        key = (shape, tier, n)
        old = self._seconds.get(key)
        self._seconds[key] = seconds if old is None else (1 - COST_EWMA) * old + COST_EWMA * seconds
