"""Which backends this host can serve: the `statefleet.backends` entry points, resolved lazily.

A distribution registers a backend as `name = "module:Class"` under the entry-point group
`statefleet.backends` (statefleet's own reference backends register the same way in its
pyproject). Nothing is imported until a backend is first built, and only in the engine-host
process. Two distributions claiming one name is a `ConfigError` unless the host's config names
the one it serves (`backend_sources = {name: "module:Class"}`), which also serves a class that
no distribution registers.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Iterable
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from libs.errors import BadRequest, ConfigError

GROUP = "statefleet.backends"


def _checked_source(name: str, source: str) -> str:
    module, sep, attr = source.partition(":")
    if not sep or not module or not attr:
        raise ConfigError(f"backend {name!r}: source {source!r} is not 'module:Class'", backend=name)
    return source


class Registry:
    def __init__(self, overrides: dict[str, str] | None = None,
                 discovered: Iterable[EntryPoint] | None = None) -> None:
        claims: dict[str, set[str]] = {}
        for ep in entry_points(group=GROUP) if discovered is None else discovered:
            claims.setdefault(ep.name, set()).add(ep.value)
        overrides = overrides or {}
        clashes = {n: sorted(v) for n, v in claims.items() if len(v) > 1 and n not in overrides}
        if clashes:
            raise ConfigError(f"backend names registered by more than one distribution: {clashes}; "
                              "choose one in the host config's backend_sources", clashes=clashes)
        self.sources = {n: next(iter(v)) for n, v in claims.items()}
        self.sources.update({n: _checked_source(n, s) for n, s in overrides.items()})
        self._loaded: dict[str, Any] = {}
        self._lock = threading.Lock()  # backends are built on worker threads

    def names(self) -> list[str]:
        return sorted(self.sources)

    def load(self, name: str) -> Any:
        """The backend class registered as `name`, imported on first use."""
        with self._lock:
            if name in self._loaded:
                return self._loaded[name]
            source = self.sources.get(name)
            if source is None:
                raise BadRequest(f"unknown backend {name!r}; this host serves {self.names()}", backend=name)
            module, _, attr = source.partition(":")
            try:
                cls = importlib.import_module(module)
                for part in attr.split("."):
                    cls = getattr(cls, part)
            except (ImportError, AttributeError) as e:
                raise ConfigError(f"backend {name!r} ({source}) does not load: {e!r}", backend=name) from None
            for need in ("config_type", "init_state", "state_spec", "parse_input", "encode", "denoise_batch",
                         "decode"):
                if not hasattr(cls, need):
                    raise ConfigError(f"backend {name!r} ({source}) lacks {need}", backend=name)
            self._loaded[name] = cls
            return cls
