"""Profile rows measured on this host at start-up: what a block costs per backend and quality tier."""

from __future__ import annotations

import time

import msgspec

from libs.checkpoint import tree_bytes
from libs.checkpoint.tree import tensors as tree_tensors
from libs.motion import crc
from libs.schemas.common import ProfileRow
from services.engine_host import colocated
from services.engine_host.backends import Backend
from services.engine_host.backends import spec as specs
from services.engine_host.backends.base import init_kinds, max_init_bytes, scratch_state

DIRTY_CHUNK_BYTES = 1 << 20  # the mover's default chunk: what a pre-copy round resends is counted in these


def measure(backend: Backend, *, blocks: int = 3, warmup: int = 1) -> list[ProfileRow]:
    """Run `warmup + blocks` blocks per tier on a scratch session; the fastest of the measured blocks
    becomes the row. Other work on the machine (the host's own co-hosts profiling at the same time
    included) only ever adds to a block's time, so the minimum is the estimate of what a block costs
    here that such noise moves least; serving then learns the cost under the load it meets
    (`refreshed_profile`). Blocking (it runs the model): call it from a thread."""
    state = scratch_state(backend)  # needs no user's prompt or image
    spec = backend.state_spec()
    moved = specs.select(state, spec)
    rows = []
    for tier in backend.tiers:
        quantum, whole = [], []
        dirty = 0
        for i in range(warmup + blocks):
            before = chunk_crcs(moved) if i == warmup else None
            t0 = time.perf_counter()
            carry = backend.encode(state, [])
            colocated.sync(backend)
            t1 = time.perf_counter()
            carry = backend.denoise(state, carry, tier)
            colocated.sync(backend)
            t2 = time.perf_counter()
            backend.decode(state, carry)
            colocated.sync(backend)
            if i >= warmup:
                quantum.append((t2 - t1) * 1000)
                whole.append((time.perf_counter() - t0) * 1000)
            if before is not None:
                dirty = dirty_bytes(before, chunk_crcs(moved))
        rows.append(ProfileRow(backend=backend.name, tier=tier, quantum_ms=min(quantum),
                               block_ms=min(whole), state_bytes=tree_bytes(state),
                               media_s_per_block=backend.media_s_per_block, moved_bytes=tree_bytes(moved),
                               dirty_bytes_per_block=dirty,
                               input_kinds=sorted(backend.input_kinds),
                               max_input_bytes=getattr(backend, "max_input_bytes", 0),
                               init_kinds=sorted(init_kinds(backend)), max_init_bytes=max_init_bytes(backend)))
    if specs.tensor_bytes(spec, "rebuildable"):  # after every tier's blocks: the history a rebuild replays is full
        rebuild_ms = _time_rebuild(backend, state)
        rows = [msgspec.structs.replace(r, rebuild_ms=rebuild_ms) for r in rows]
    return rows


def measure_colocated(backend: Backend, rows: list[ProfileRow], *, max_sessions: int, threads: int = 0,
                      blocks: int = 2, reps: int = 2, probes: colocated.Spreader | None = None) -> list[ProfileRow]:
    """`rows` (this backend's, from `measure`) with their co-location curve: block ms at 1, 2, 4, …
    concurrent scratch sessions up to `max_sessions`, run through the stages as the host's pipeline runs
    them, and spread over the device's other host processes too where it has some (`probes`;
    `colocated.curve`). Blocking: call it from a thread."""
    ks = colocated.concurrencies(max_sessions)
    return [msgspec.structs.replace(r, colocated=colocated.curve(backend, r.tier, ks, blocks=blocks, reps=reps,
                                                                 threads=threads, probes=probes))
            if r.backend == backend.name else r for r in rows]


def consistent(rows: list[ProfileRow]) -> list[ProfileRow]:
    """Start-up rows with the noise that only ever adds time taken out where two measurements bound one
    cost: a lone block is the cheaper of `measure`'s and the curve's first point (both time one session
    alone), and a tier costs no more than any higher tier of its backend (a block at a lower tier runs a
    subset of the same stages: fewer denoise steps), point by point along the curve. Measured as taken,
    a cold first tier read 5.61 ms where the curve's lone point read 2.34 and tier 2 read 3.48
    (2026-12-06): a floor priced from the fresher tier by that ratio swung the host's load 0.3 to 2.0
    heartbeat to heartbeat, and admission placed into the low readings. `quantum_ms` keeps its share of
    the block."""
    out = {id(r): r for r in rows}
    for name in {r.backend for r in rows}:
        cheapest: ProfileRow | None = None  # the fixed row of the next higher tier
        for r in sorted((r for r in rows if r.backend == name), key=lambda r: -r.tier):
            curve = list(r.colocated)
            lone = min(r.block_ms, curve[0]) if curve else r.block_ms
            if cheapest is not None:
                lone = min(lone, cheapest.block_ms)
                if len(cheapest.colocated) == len(curve):
                    curve = [min(a, b) for a, b in zip(curve, cheapest.colocated, strict=True)]
            if curve:
                curve[0] = lone
            scale = lone / r.block_ms if r.block_ms > 0 else 1.0
            cheapest = out[id(r)] = msgspec.structs.replace(r, block_ms=lone, quantum_ms=r.quantum_ms * scale,
                                                            colocated=curve)
    return [out[id(r)] for r in rows]


def _time_rebuild(backend: Backend, state: dict) -> float:
    """What re-deriving the scratch session's rebuildable leaves takes (a rebuild is exact, so
    running it on the live scratch state changes nothing)."""
    t0 = time.perf_counter()
    backend.rebuild(state)
    colocated.sync(backend)
    return (time.perf_counter() - t0) * 1000


def chunk_crcs(tree: dict, chunk_bytes: int = DIRTY_CHUNK_BYTES) -> list[tuple[int, int]]:
    """(CRC, length) of every chunk of every tensor leaf, in tree order: two calls around a block
    tell which bytes it rewrote, as a pre-copy round sees them."""
    out = []
    for t in tree_tensors(tree):
        view = crc.byte_view(t)
        out += [(crc.crc_bytes(view[o:o + chunk_bytes]), min(chunk_bytes, view.numel() - o))
                for o in range(0, view.numel(), chunk_bytes)]
    return out


def dirty_bytes(before: list[tuple[int, int]], after: list[tuple[int, int]]) -> int:
    return sum(n for (a, n), (b, _) in zip(before, after, strict=True) if a != b)
