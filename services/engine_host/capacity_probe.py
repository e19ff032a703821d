"""The device's capacity curve, measured at start-up under co-location (libs/capacity_model.py).

For each tier of a backend, N scratch sessions (N = 1, 2, 4, … up to the host's slots) each run a
block, `in_flight` at a time as the host's dispatcher runs them, on threads with the host's torch
thread count: the round's wall time over N is the chunk time at N, and each block's own time through
encode, denoise and decode its latency at N. The doubling stops once a round takes `max_round_s`
(more such sessions would miss any period shorter than that) or the budget is spent. Blocking: run
it from a thread.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable

from libs.schemas.capacity import Curve, CurvePoint
from libs.schemas.engine import SessionInit
from services.engine_host.backends import Backend
from services.engine_host.costs import shape_of
from services.engine_host.profile import _sync


def _block(backend: Backend, state: dict, tier: int) -> float:
    t0 = time.perf_counter()
    carry = backend.encode(state, [])
    carry = backend.denoise(state, carry, tier)
    backend.decode(state, carry)
    _sync(backend)
    return (time.perf_counter() - t0) * 1000


def _round(backend: Backend, states: list[dict], tier: int, in_flight: int,
           start_thread: Callable[[Callable[[], None]], threading.Thread]) -> tuple[float, list[float]]:
    """Every state runs one block, `in_flight` at a time: (the round's wall ms, each block's ms)."""
    lanes = [states[i::in_flight] for i in range(min(in_flight, len(states)))]
    times: list[list[float]] = [[] for _ in lanes]

    def lane(i: int) -> Callable[[], None]:
        return lambda: times[i].extend(_block(backend, s, tier) for s in lanes[i])

    t0 = time.perf_counter()
    threads = [start_thread(lane(i)) for i in range(len(lanes))]
    for t in threads:
        t.join()
    return (time.perf_counter() - t0) * 1000, [x for ts in times for x in ts]


def measure(backend: Backend, *, slots: int, in_flight: int, rounds: int,
            start_thread: Callable[[Callable[[], None]], threading.Thread],
            max_round_s: float = 0.5, budget_s: float = 6.0) -> list[Curve]:
    """One curve per tier of `backend` on this device. `start_thread` starts a thread that runs model
    code (with the host's torch thread count: `torch_threads.thread`)."""
    curves = []
    for tier in backend.tiers:
        deadline = time.monotonic() + budget_s / max(len(backend.tiers), 1)
        points: list[CurvePoint] = []
        states: list[dict] = []
        n = 1
        while n <= slots:
            states += [backend.init_state(len(states) + 1, SessionInit(prompt="capacity"))
                       for _ in range(n - len(states))]
            _round(backend, states, tier, in_flight, start_thread)  # warm: caches, allocator, first touch
            walls, lat = [], []
            for _ in range(rounds):
                wall, blocks = _round(backend, states, tier, in_flight, start_thread)
                walls.append(wall)
                lat += blocks
            points.append(CurvePoint(sessions=n, chunk_ms=statistics.median(walls) / n,
                                     block_ms=statistics.median(lat), blocks=len(lat)))
            if statistics.median(walls) > max_round_s * 1000 or time.monotonic() > deadline or n == slots:
                break
            n = min(2 * n, slots)
        curves.append(Curve(backend=backend.name, shape=shape_of(backend), tier=tier, points=points,
                            startup=points))
    return curves
