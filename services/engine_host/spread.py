"""Probe processes: a device's co-location curve measured with its sessions spread over all its hosts.

`statefleet up` starts two engine-host processes on one machine's CPU, and placement may split a
device's sessions between them (a failover, a drain, a tie). Two processes on one CPU take more stage
time per block than one process running the same sessions: each process's stages wait while the other
holds a core (bench.colocation `--split`: 1.3-2.3x by the median of rounds, docs/bench-colocation.md).
A curve measured inside one process priced such a device low, and it ran past its limit (issue 23).
So the device's one measurer also runs each point with the k sessions spread over as many processes as
the device has hosts: it starts `n - 1` probe processes (the same backends, configs and torch threads
as a host) which run their share of the k sessions at the same moment it runs its own, and the
device's cost of a block is the stage time every process spent over the blocks they all ran, as the
hosts' `DeviceTime` would sum it.

The probes are children of the measuring host, not its peer hosts: a peer is still starting (it has
not built its backends) while the measurer profiles, and a probe needs nothing but the backend; the
peers wait for the published rows meanwhile, so the machine carries the probes and nothing else.
"""

from __future__ import annotations

import os
import pickle
import select
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from services.engine_host import colocated
from services.engine_host.backends import Backend

WAIT_S = 300.0  # a probe that has not answered this long after it was asked is given up (ProbeFailed)
JOIN_S = 10.0  # a probe that does not exit this long after it was told to is killed


class ProbeFailed(RuntimeError):
    """A probe process died or hung: the point was not measured across the device's processes."""


def _timed(backend: Backend, tier: int, states: list[dict], blocks: int, threads: int) -> tuple[float, float, float, int]:
    """(start, end, stage seconds, blocks) of one process's share of a point; an empty share runs nothing."""
    t0 = time.monotonic()
    if not states:
        return t0, t0, 0.0, 0
    run = colocated.run_blocks(backend, tier, states, blocks, threads)
    n = blocks * len(states)
    return t0, time.monotonic(), run.stage_ms * n / 1000, n


class Probes:
    """`n` probe processes standing in for the device's other hosts while its curve is measured.

    Each is `python -m services.engine_host.spread` (a plain program, not a `multiprocessing` child:
    that would import the host's own main module again) talking pickles over its stdin and stdout.
    Use as a context manager from a worker thread (it blocks): `run` measures one point with this
    process's share beside theirs.
    """

    def __init__(self, n: int, *, sources: dict[str, str], configs: dict[str, bytes], device: str,
                 threads: int) -> None:
        self.processes = n + 1
        self.procs: list[subprocess.Popen] = []
        try:
            for _ in range(n):
                p = subprocess.Popen([sys.executable, "-m", "services.engine_host.spread"], env=_same_code(),
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)
                self.procs.append(p)
                self._send(p, (sources, configs, device, threads))
            for p in self.procs:  # up (torch imported): no point is measured beside a probe's own start-up
                if self._recv(p) != "up":
                    raise ProbeFailed("a probe process answered out of turn")
        except (OSError, ProbeFailed) as e:
            self.close()
            raise ProbeFailed(f"a probe process did not start: {e!r}") from e

    def __enter__(self) -> Probes:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run(self, backend: Backend, tier: int, states: list[dict], share: Sequence[int], blocks: int,
            threads: int) -> colocated.Run:
        """One point: `share[0]` of `states` here, `share[i]` in probe i, all at once (each warms its
        sessions first, then all start on one signal). The device's block is every process's stage
        seconds over every block run (`stage_ms`), and the wall time from the first start to the last
        end over them (`wall_ms`)."""
        for p, k in zip(self.procs, share[1:], strict=True):
            self._send(p, (backend.name, tier, k, blocks))
        mine = states[:share[0]]
        if mine:
            colocated.run_blocks(backend, tier, mine, 1, threads)  # warm at this k
        for p in self.procs:
            if self._recv(p) != "ready":
                raise ProbeFailed("a probe process answered out of turn")
        for p in self.procs:
            self._send(p, "go")
        spans = [_timed(backend, tier, mine, blocks, threads)] + [self._recv(p) for p in self.procs]
        ran = [s for s in spans if s[3]]
        n = sum(s[3] for s in ran)
        wall = max(s[1] for s in ran) - min(s[0] for s in ran)
        return colocated.Run(wall_ms=wall * 1000 / n, stage_ms=sum(s[2] for s in ran) * 1000 / n)

    def close(self) -> None:
        for p in self.procs:
            try:
                self._send(p, None)
            except ProbeFailed:
                pass
        for p in self.procs:
            try:
                p.wait(JOIN_S)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs = []

    @staticmethod
    def _send(p: subprocess.Popen, msg: object) -> None:
        assert p.stdin is not None
        try:
            p.stdin.write(pickle.dumps(msg))
            p.stdin.flush()
        except OSError as e:
            raise ProbeFailed(f"a probe process is gone: {e!r}") from e

    @staticmethod
    def _recv(p: subprocess.Popen) -> Any:
        assert p.stdout is not None
        ready, _, _ = select.select([p.stdout], [], [], WAIT_S)  # one message in flight: nothing is buffered
        if not ready:
            raise ProbeFailed("a probe process did not answer")
        try:
            return pickle.load(p.stdout)
        except (EOFError, pickle.UnpicklingError) as e:
            raise ProbeFailed(f"a probe process died: {e!r}") from e


def _same_code() -> dict[str, str]:
    """The environment with this process's own source tree first on the path: a probe runs the code
    its host runs, wherever the interpreter's installed copy points."""
    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    return env


def serve(inbox: IO[bytes], outbox: IO[bytes]) -> None:
    """A probe's loop: build a backend when first asked for it, warm the asked sessions, say so, run
    their blocks on "go", and answer the span and the stage seconds."""
    import torch

    from services.engine_host.backends import Registry, make_backend
    from services.engine_host.backends.base import scratch_state

    def say(msg: object) -> None:
        outbox.write(pickle.dumps(msg))
        outbox.flush()

    sources, configs, device, threads = pickle.load(inbox)
    if threads:
        torch.set_num_threads(threads)
    registry = Registry(sources)
    built: dict[str, tuple[Backend, list[dict]]] = {}
    say("up")

    while (ask := pickle.load(inbox)) is not None:
        name, tier, k, blocks = ask
        if name not in built:
            built[name] = (make_backend(registry, name, configs.get(name, b""), torch.device(device)), [])
        backend, states = built[name]
        states += [scratch_state(backend, seed=1000 + i) for i in range(len(states), k)]
        if k:
            colocated.run_blocks(backend, tier, states[:k], 1, threads)
        say("ready")
        if pickle.load(inbox) != "go":
            return
        say(_timed(backend, tier, states[:k], blocks, threads))


if __name__ == "__main__":
    serve(sys.stdin.buffer, sys.stdout.buffer)
