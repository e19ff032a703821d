"""Profile rows measured on this host at start-up: what a block costs per backend and quality tier."""

from __future__ import annotations

import statistics
import time

from libs.checkpoint import tree_bytes
from libs.schemas.common import ProfileRow
from services.engine_host.backends import Backend


def _sync(backend: Backend) -> None:
    import torch

    if backend.device.type == "cuda":
        torch.cuda.synchronize(backend.device)


def measure(backend: Backend, *, blocks: int = 5, warmup: int = 2) -> list[ProfileRow]:
    """Run `warmup + blocks` blocks per tier on a scratch session; the medians become the rows.
    Blocking (it runs the model): call it from a thread."""
    state = backend.init_state(0, "profile")
    rows = []
    for tier in backend.tiers:
        quantum, whole = [], []
        for i in range(warmup + blocks):
            t0 = time.perf_counter()
            carry = backend.encode(state, [])
            _sync(backend)
            t1 = time.perf_counter()
            carry = backend.denoise(state, carry, tier)
            _sync(backend)
            t2 = time.perf_counter()
            backend.decode(state, carry)
            _sync(backend)
            if i >= warmup:
                quantum.append((t2 - t1) * 1000)
                whole.append((time.perf_counter() - t0) * 1000)
        rows.append(ProfileRow(backend=backend.name, tier=tier, quantum_ms=statistics.median(quantum),
                               block_ms=statistics.median(whole), state_bytes=tree_bytes(state),
                               media_s_per_block=backend.media_s_per_block,
                               input_kinds=sorted(backend.input_kinds),
                               max_input_bytes=getattr(backend, "max_input_bytes", 0)))
    return rows
