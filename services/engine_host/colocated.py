"""The co-location curve: what a block costs on this device when k sessions share it.

A block measured alone is not what it costs beside others: the host's pipeline runs encode, denoise
and decode of different sessions on their own threads at once, so on a CPU their torch threads
contend for the same cores (and on a GPU their kernels for the same SMs), and a device priced at
the lone block's cost was admitted past what it carried (issue 23). So start-up also runs k scratch
sessions through the stages the way the host's pipeline does (one thread per stage, each session's
blocks strictly in order, the sessions' blocks handed out round-robin) and prices a block at k as
the stage time all of them took over the blocks they ran: the device load one block makes when k
sessions share the device, counted as the hosts count what they measure (`DeviceTime`: every
stage's own wall time) and as serving learns a block's cost (the sum of its stage times), so the
curve, the learned prices and the measured load are one quantity. Where the device has several host
processes, the points are also measured spread over them (`spread.py`).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple, Protocol

from services.engine_host import torch_threads
from services.engine_host.backends import Backend
from services.engine_host.backends.base import scratch_state


def concurrencies(max_sessions: int) -> list[int]:
    """1, 2, 4, 8, … up to the host's slot limit: the k of `ProfileRow.colocated[i]` is 2**i (beyond the
    last, the capacity model extrapolates)."""
    return [1 << i for i in range(max(1, max_sessions).bit_length())]


def curve(backend: Backend, tier: int, ks: Sequence[int], *, blocks: int = 2, reps: int = 3,
          threads: int = 0, probes: Spreader | None = None) -> list[float]:
    """Stage ms per block at each k in `ks` (what the device's measured load counts a block at): the
    fastest of `reps` runs of k sessions × `blocks` blocks (noise only ever adds time, as in
    `profile.measure`). With `probes` (the device has more host processes than this one), each point is
    also run with the k sessions spread over all of them at once, and the point is the dearer of the
    two: placement does not promise which process of a device a session lands on, and two processes
    on one CPU take more stage time per block than one (docs/bench-colocation.md). Blocking: call it
    from a thread."""
    states = [scratch_state(backend, seed=i) for i in range(max(ks))]
    out = []
    for k in ks:
        run_blocks(backend, tier, states[:k], 1, threads)  # warm-up: caches filled at this k
        point = min(run_blocks(backend, tier, states[:k], blocks, threads).stage_ms for _ in range(reps))
        if probes is not None and k > 1:
            share = spread_shares(k, probes.processes)
            point = max(point, min(probes.run(backend, tier, states, share, blocks, threads).stage_ms
                                   for _ in range(reps)))
        out.append(point)
    return out


class Run(NamedTuple):
    """One run of k sessions' blocks, per block: `wall_ms` is the wall time over the blocks run (the
    device's throughput), `stage_ms` the stage seconds they took, summed over the stages: what a host's
    `DeviceTime` counts as the device load a block made (stages that overlap, or wait for a core a peer
    holds, each count their own wall time)."""

    wall_ms: float
    stage_ms: float


class Spreader(Protocol):
    """Runs a point with its sessions spread over the device's host processes (`spread.Probes`)."""

    processes: int  # this one and the probes

    def run(self, backend: Backend, tier: int, states: list[dict], share: Sequence[int], blocks: int,
            threads: int) -> Run: ...


def spread_shares(k: int, processes: int) -> list[int]:
    """`k` sessions over `processes` processes, round-robin (the first gets the remainder)."""
    return [k // processes + (1 if i < k % processes else 0) for i in range(processes)]


def run_blocks(backend: Backend, tier: int, states: list[dict], blocks: int, threads: int) -> Run:
    """`blocks` blocks of every state through three stage threads (one block of a session in flight at
    a time, as the pipeline's strict per-session order allows). A lone session's blocks cross every
    stage on one thread, as the pipeline runs them when nothing else waits."""
    if len(states) == 1:
        return _alone(backend, tier, states[0], blocks, threads)
    edges: list[queue.Queue] = [queue.Queue() for _ in range(3)]
    done: queue.Queue = queue.Queue()
    carry: dict[int, object] = {}
    spent = [0.0, 0.0, 0.0]  # stage seconds, one slot per stage thread (each writes its own)

    def stage(n: int, inbox: queue.Queue, out: queue.Queue, body: Callable[[int], None]) -> None:
        if threads:
            torch_threads.pin(threads)
        while (i := inbox.get()) is not None:
            t = time.perf_counter()
            body(i)
            spent[n] += time.perf_counter() - t
            out.put(i)
        out.put(None)

    def enc(i: int) -> None:
        carry[i] = backend.encode(states[i], [])

    def den(i: int) -> None:
        carry[i] = backend.denoise(states[i], carry[i], tier)

    def dec(i: int) -> None:
        backend.decode(states[i], carry.pop(i))
        sync(backend)

    workers = [threading.Thread(target=stage, args=(0, edges[0], edges[1], enc), daemon=True),
               threading.Thread(target=stage, args=(1, edges[1], edges[2], den), daemon=True),
               threading.Thread(target=stage, args=(2, edges[2], done, dec), daemon=True)]
    t0 = time.perf_counter()
    for w in workers:
        w.start()
    left = [blocks] * len(states)
    for i in range(len(states)):
        edges[0].put(i)
        left[i] -= 1
    finished = 0
    while finished < blocks * len(states):
        i = done.get()
        finished += 1
        if left[i]:
            left[i] -= 1
            edges[0].put(i)
    edges[0].put(None)
    for w in workers:
        w.join()
    n = blocks * len(states)
    return Run(wall_ms=(time.perf_counter() - t0) * 1000 / n, stage_ms=sum(spent) * 1000 / n)


def _alone(backend: Backend, tier: int, state: dict, blocks: int, threads: int) -> Run:
    if threads:
        torch_threads.pin(threads)
    t0 = time.perf_counter()
    for _ in range(blocks):
        backend.decode(state, backend.denoise(state, backend.encode(state, []), tier))
        sync(backend)
    ms = (time.perf_counter() - t0) * 1000 / blocks
    return Run(wall_ms=ms, stage_ms=ms)


def sync(backend: Backend) -> None:
    """Wait for the device's queued work, so a time read after it covers the work."""
    import torch

    if backend.device.type == "cuda":
        torch.cuda.synchronize(backend.device)
