"""The capacity baseline of `bench.c1_periods`: the backend alone, without the stack.

`sessions` scratch sessions' blocks run back to back at the quality floor's tier in this process
(every stage: encode, denoise, decode), with the torch threads each engine host of the stack takes;
the most blocks that fit in one period is the number of such sessions the device could carry with
nothing else on it. Measured in the same run as the stack rounds, just before each.
"""

from __future__ import annotations

import statistics
import time

import torch

from libs.schemas.engine import SessionInit
from services.engine_host.backends import Registry, make_backend
from services.engine_host.torch_threads import default_count, machine_cores


def back_to_back(backend_name: str, *, sessions: int, floor: int, period_ms: float, hosts: int,
                 repeats: int = 5) -> dict:
    """{'block_ms': median per block, 'capacity': the most blocks that fit in `period_ms`}."""
    before = torch.get_num_threads()
    threads = default_count(machine_cores(), hosts)
    torch.set_num_threads(threads)
    try:
        backend = make_backend(Registry({}), backend_name, b"", torch.device("cpu"))
        tier = min(t for t in backend.tiers if t >= floor)
        states = [backend.init_state(i, SessionInit(prompt="baseline")) for i in range(max(1, sessions))]
        per_block = []
        for r in range(repeats + 1):
            t0 = time.perf_counter()
            for state in states:
                backend.decode(state, backend.denoise(state, backend.encode(state, []), tier))
            if r:  # the first pass warms up
                per_block.append((time.perf_counter() - t0) * 1000 / len(states))
    finally:
        torch.set_num_threads(before)
    block_ms = statistics.median(per_block)
    return {"block_ms": block_ms, "capacity": int(period_ms // block_ms), "tier": tier, "threads": threads}
