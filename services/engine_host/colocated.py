"""The co-location curve: what a block costs on this device when k sessions share it.

A block measured alone is not what it costs beside others: the host's pipeline runs encode, denoise
and decode of different sessions on their own threads at once, so on a CPU their torch threads
contend for the same cores (and on a GPU their kernels for the same SMs), and a device priced at
the lone block's cost was admitted past what it carried (issue 23). So start-up also runs k scratch
sessions through the stages the way the host's pipeline does (one thread per stage, each session's
blocks strictly in order, the sessions' blocks handed out round-robin) and prices a block at k as
the wall time all of them took over the blocks they ran: the device time one block takes when k
sessions keep it busy.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence

from services.engine_host import torch_threads
from services.engine_host.backends import Backend
from services.engine_host.backends.base import scratch_state


def concurrencies(max_sessions: int) -> list[int]:
    """1, 2, 4, 8, … up to the host's slot limit: the k of `ProfileRow.colocated[i]` is 2**i (beyond the
    last, the capacity model extrapolates)."""
    return [1 << i for i in range(max(1, max_sessions).bit_length())]


def curve(backend: Backend, tier: int, ks: Sequence[int], *, blocks: int = 2, reps: int = 3,
          threads: int = 0) -> list[float]:
    """Block ms at each k in `ks`: the fastest of `reps` runs of k sessions × `blocks` blocks (noise
    only ever adds time, as in `profile.measure`). Blocking: call it from a thread."""
    states = [scratch_state(backend, seed=i) for i in range(max(ks))]
    out = []
    for k in ks:
        run_blocks(backend, tier, states[:k], 1, threads)  # warm-up: caches filled at this k
        out.append(min(run_blocks(backend, tier, states[:k], blocks, threads) for _ in range(reps)))
    return out


def run_blocks(backend: Backend, tier: int, states: list[dict], blocks: int, threads: int) -> float:
    """Ms per block of `blocks` blocks of every state through three stage threads (one block of a
    session in flight at a time, as the pipeline's strict per-session order allows). A lone session's
    blocks cross every stage on one thread, as the pipeline runs them when nothing else waits."""
    if len(states) == 1:
        return _alone(backend, tier, states[0], blocks, threads)
    edges: list[queue.Queue] = [queue.Queue() for _ in range(3)]
    done: queue.Queue = queue.Queue()
    carry: dict[int, object] = {}

    def stage(inbox: queue.Queue, out: queue.Queue, body: Callable[[int], None]) -> None:
        if threads:
            torch_threads.pin(threads)
        while (i := inbox.get()) is not None:
            body(i)
            out.put(i)
        out.put(None)

    def enc(i: int) -> None:
        carry[i] = backend.encode(states[i], [])

    def den(i: int) -> None:
        carry[i] = backend.denoise(states[i], carry[i], tier)

    def dec(i: int) -> None:
        backend.decode(states[i], carry.pop(i))
        sync(backend)

    workers = [threading.Thread(target=stage, args=(edges[0], edges[1], enc), daemon=True),
               threading.Thread(target=stage, args=(edges[1], edges[2], den), daemon=True),
               threading.Thread(target=stage, args=(edges[2], done, dec), daemon=True)]
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
    return (time.perf_counter() - t0) * 1000 / (blocks * len(states))


def _alone(backend: Backend, tier: int, state: dict, blocks: int, threads: int) -> float:
    if threads:
        torch_threads.pin(threads)
    t0 = time.perf_counter()
    for _ in range(blocks):
        backend.decode(state, backend.denoise(state, backend.encode(state, []), tier))
        sync(backend)
    return (time.perf_counter() - t0) * 1000 / blocks


def sync(backend: Backend) -> None:
    """Wait for the device's queued work, so a time read after it covers the work."""
    import torch

    if backend.device.type == "cuda":
        torch.cuda.synchronize(backend.device)
