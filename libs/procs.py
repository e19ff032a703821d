"""Child processes that die with their parent (Linux PR_SET_PDEATHSIG)."""

from __future__ import annotations

import ctypes
import signal
import sys

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """preexec_fn: ask the kernel to SIGTERM this child when the spawning thread's process dies."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
