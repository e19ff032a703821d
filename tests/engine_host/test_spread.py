"""A device's co-location curve is measured with its sessions spread over its host processes too
(services/engine_host/spread.py, colocated.curve)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from services.engine_host import colocated, spread
from services.engine_host.backends import Backend, Registry, make_backend


class Dearer:
    """A stand-in for the probes: every spread point costs `ms`, and the shares asked are kept."""

    processes = 2

    def __init__(self, ms: float) -> None:
        self.ms = ms
        self.asked: list[list[int]] = []

    def run(self, backend: Backend, tier: int, states: list[dict], share: Sequence[int], blocks: int,
            threads: int) -> colocated.Run:
        self.asked.append(list(share))
        return colocated.Run(wall_ms=self.ms / 2, stage_ms=self.ms)


def world() -> tuple[Registry, Backend]:
    registry = Registry()
    return registry, make_backend(registry, "world", b"", torch.device("cpu"))


def test_a_point_is_the_dearer_of_one_process_and_spread_over_the_devices_processes():
    _, backend = world()
    alone = colocated.curve(backend, 1, [1, 2, 4], blocks=1, reps=1, threads=1)
    dear = Dearer(1e6)  # no block takes a thousand seconds: the spread arm is the dearer at every k > 1
    curve = colocated.curve(backend, 1, [1, 2, 4], blocks=1, reps=1, threads=1, probes=dear)
    assert curve[1:] == [1e6, 1e6] and curve[0] < 1e6 and len(alone) == 3
    assert dear.asked == [[1, 1], [2, 2]]  # k = 1 cannot be split; the rest round-robin over the processes
    cheap = Dearer(0.0)  # spread cheaper than one process: the one-process point stands
    assert all(0 < ms < 1e6 for ms in colocated.curve(backend, 1, [1, 2], blocks=1, reps=1, threads=1, probes=cheap))
    assert colocated.spread_shares(5, 2) == [3, 2] and colocated.spread_shares(1, 3) == [1, 0, 0]


def test_probe_processes_run_their_share_at_the_same_time_and_report_every_block():
    registry, backend = world()
    states = [colocated.scratch_state(backend, seed=i) for i in range(2)]
    with spread.Probes(1, sources=registry.sources, configs={}, device="cpu", threads=1) as probes:
        assert probes.processes == 2
        split = probes.run(backend, 1, states, [1, 1], 2, 1)
        here = probes.run(backend, 1, states, [2, 0], 2, 1)  # the probe idle: this process alone
        there = probes.run(backend, 1, states, [0, 2], 2, 1)  # all in the probe
    assert all(r.stage_ms > 0 and r.wall_ms > 0 for r in (split, here, there))
    assert probes.procs == []  # closed: the probe exited
