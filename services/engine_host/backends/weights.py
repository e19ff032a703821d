"""Model weights: generated from a seed, or loaded from a local safetensors file whose sha256 the
backend config names; either way built once per host (per process) and shared by every backend
instance and session that asks for the same key.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable
from pathlib import Path

import torch

from libs.errors import ConfigError

Weights = dict[str, torch.Tensor]

_shared: dict[tuple, Weights] = {}
_lock = threading.Lock()


def shared(key: tuple, build: Callable[[], Weights]) -> Weights:
    """The weights for `key`, built on first use; later callers (other configs, other sessions) get
    the same tensors. Never written after they are built."""
    with _lock:
        if key not in _shared:
            _shared[key] = build()
        return _shared[key]


def sha256_of(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(8 << 20):
            h.update(block)
    return h.hexdigest()


def load(path: str, sha256: str, expected: dict[str, tuple[torch.dtype, tuple[int, ...]]],
         device: torch.device) -> Weights:
    """Tensors from `path`, refused unless the file's sha256 is `sha256` and it holds exactly the
    `expected` names at their dtypes and shapes."""
    from safetensors.torch import load_file

    if not sha256:
        raise ConfigError(f"weights {path} need their sha256 in the backend config", path=path)
    try:
        digest = sha256_of(path)
    except OSError as e:
        raise ConfigError(f"weights {path} do not open: {e}", path=path) from None
    if digest != sha256.lower():
        raise ConfigError(f"weights {path} have sha256 {digest}, the config says {sha256}", path=path)
    tensors = load_file(path, device=str(device))
    if set(tensors) != set(expected):
        missing, extra = sorted(set(expected) - set(tensors)), sorted(set(tensors) - set(expected))
        raise ConfigError(f"weights {path} lack {missing[:5]} or have unexpected {extra[:5]}", path=path)
    for name, (dtype, shape) in expected.items():
        t = tensors[name]
        if t.dtype != dtype or tuple(t.shape) != shape:
            raise ConfigError(f"weight {name} in {path} is {t.dtype}{list(t.shape)}, the model needs "
                              f"{dtype}{list(shape)}", path=path, weight=name)
    return tensors


def save(weights: Weights, path: str | Path) -> str:
    """Write weights as safetensors; returns the file's sha256 (what a config names)."""
    from safetensors.torch import save_file

    save_file({k: v.detach().cpu().contiguous() for k, v in weights.items()}, str(path))
    return sha256_of(path)
