"""Model backends: the interface (`base`), the state layout (`spec`), the registry of what a host
serves (`registry`, the `statefleet.backends` entry points) and the reference models (`world`,
`avatar`, `dit`), imported only when used."""

from __future__ import annotations

import importlib
from typing import Any

import msgspec
import torch

from libs.errors import BadRequest
from services.engine_host.backends.base import Backend, Output, advance, check_backend
from services.engine_host.backends.registry import Registry

__all__ = ["AvatarBackend", "AvatarConfig", "Backend", "DitConfig", "DitWorldBackend", "Output", "Registry",
           "WorldBackend", "WorldConfig", "advance", "make_backend"]

_REFERENCE = {"WorldBackend": "world", "WorldConfig": "world", "AvatarBackend": "avatar",
              "AvatarConfig": "avatar", "DitWorldBackend": "dit", "DitConfig": "dit"}


def __getattr__(name: str) -> Any:
    """The reference backends' classes, imported on first use (the registry imports them the same way)."""
    if name in _REFERENCE:
        return getattr(importlib.import_module(f"{__name__}.{_REFERENCE[name]}"), name)
    raise AttributeError(name)


def make_backend(registry: Registry, name: str, config: bytes, device: torch.device) -> Backend:
    """A backend by name from its msgpack config (as carried in a session descriptor); b"" = defaults."""
    cls = registry.load(name)
    try:
        cfg = msgspec.msgpack.decode(config, type=cls.config_type) if config else cls.config_type()
    except msgspec.DecodeError as e:
        raise BadRequest(f"bad {name} backend config: {e}", backend=name) from None
    backend = cls(cfg, device)
    check_backend(backend)
    return backend
