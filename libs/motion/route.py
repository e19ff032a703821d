"""Which transport a move takes: a pure choice from where the two hosts are and what was asked."""

from __future__ import annotations

from libs.errors import Unavailable


def choose(asked: str, *, in_process: bool, same_machine: bool, source_device: str, dest_device: str,
           mode: str) -> str:
    """"inprocess" | "shm" | "tcp" | "mooncake" for a move asked as `asked` ("auto", "shm", "tcp",
    "mooncake"). Shared memory needs one machine and either a host-memory slot (any source writes
    into it) or CUDA on both sides with a frozen round (IPC exposes the live leaves themselves)."""
    if asked == "mooncake":
        return "mooncake"
    if in_process and asked == "auto":
        return "inprocess"
    shm_ok = same_machine and (dest_device == "cpu" or (
        source_device == dest_device == "cuda" and mode == "stop_and_copy"))
    if asked == "shm" and not shm_ok:
        raise Unavailable("a shared-memory move needs both hosts on one machine and compatible devices "
                          f"(source {source_device}, destination {dest_device or '?'}, mode {mode})")
    if asked in ("auto", "shm") and shm_ok:
        return "shm"
    return "tcp"
