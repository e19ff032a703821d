"""Model backends: the interface (`base`) and the two reference models."""

from __future__ import annotations

import torch

from libs.errors import BadRequest
from services.engine_host.backends.avatar import AvatarBackend, AvatarConfig
from services.engine_host.backends.base import Backend, Output, advance
from services.engine_host.backends.world import WorldBackend, WorldConfig

__all__ = ["AvatarBackend", "AvatarConfig", "Backend", "Output", "WorldBackend", "WorldConfig", "advance",
           "make_backend"]


def make_backend(name: str, config: bytes, device: torch.device) -> Backend:
    """A backend by name from its msgpack config (as carried in a session descriptor); b"" = defaults."""
    import msgspec

    kinds = {"world": (WorldBackend, WorldConfig), "avatar": (AvatarBackend, AvatarConfig)}
    if name not in kinds:
        raise BadRequest(f"unknown backend {name!r}; this host has {sorted(kinds)}", backend=name)
    cls, cfg_type = kinds[name]
    try:
        cfg = msgspec.msgpack.decode(config, type=cfg_type) if config else cfg_type()
    except msgspec.DecodeError as e:
        raise BadRequest(f"bad {name} backend config: {e}", backend=name) from None
    return cls(cfg, device)
