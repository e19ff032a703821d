"""CPU seconds the engine-host processes of a stack spent (user + system, every thread), from /proc.

On a CPU device a block is not the only thing that runs on the device's cores: the host's event loop
(dispatch, the sink, publishing output, pacing, the journal) shares them, and the GIL with the stage
threads. Stage timings cannot see that work; the process's CPU time does. `bench.c1_periods` reports
both, so a round shows whether the sessions were late because the stages filled the cores or because
the rest of the host did. Linux only (reads /proc); elsewhere it reports nothing.
"""

from __future__ import annotations

import os
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def engine_cpu_s(root_pid: int) -> dict[str, float]:
    """Engine host id → CPU seconds its process used so far, for engine hosts descended from `root_pid`."""
    parents: dict[int, int] = {}
    stats: dict[int, list[str]] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(d.name)] = int(fields[1])
        stats[int(d.name)] = fields
    out: dict[str, float] = {}
    for pid, fields in stats.items():
        if not _descends(pid, root_pid, parents):
            continue
        try:
            env = (Path("/proc") / str(pid) / "environ").read_bytes().split(b"\0")
            cmd = (Path("/proc") / str(pid) / "cmdline").read_bytes()
        except OSError:
            continue
        host = next((e.split(b"=", 1)[1].decode() for e in env if e.startswith(b"SF_HOST_ID=")), "")
        if host and b"engine_host" in cmd:
            out[host] = (int(fields[11]) + int(fields[12])) / _TICK  # utime + stime
    return out


def _descends(pid: int, root: int, parents: dict[int, int]) -> bool:
    seen = 0
    while pid > 1 and seen < 64:
        if pid == root:
            return True
        pid, seen = parents.get(pid, 0), seen + 1
    return False
