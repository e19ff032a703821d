"""Which machine this process runs on: the identity engine hosts announce in their heartbeat.

Two hosts with the same identity share a kernel (same boot id) under the same
host name, so shared memory between them works and a move between them takes
the shared-memory transport instead of TCP loopback.
"""

from __future__ import annotations

import functools
import socket
from pathlib import Path

BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


@functools.cache
def identity() -> str:
    """`<boot id>/<hostname>`; empty where the kernel has no boot id (then no move is taken as local)."""
    try:
        boot = BOOT_ID.read_text().strip()
    except OSError:
        return ""
    return f"{boot}/{socket.gethostname()}"
