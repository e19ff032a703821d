"""The staging pool: shadow-slot memory from a per-host arena that was faulted in once, then reused.

A move into fresh memory pays a first-touch page fault per 4 KiB page (262k
per GiB, 0.5-1.5 s per GiB on a small VM) on top of the copy. The pool maps one
shared-memory arena (a memfd) at start, touches every page once (and pins it on
GPU hosts), and hands slots regions of it. A region goes back to the pool when
the last tensor viewing it is freed: a failed or rolled-back slot at once, an
installed state when its session is dropped or moved away.

Every region, pooled or fresh, lives in a memfd, so a same-machine source can
map exactly that region and write the chunks straight into it (`libs.motion.shm`).
When the pool cannot hold a move, the slot gets a fresh memfd region and says so.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import threading
import weakref
from dataclasses import dataclass

import numpy as np
import torch

ALIGN = 64 << 10  # region granularity: page-aligned, so a peer can map exactly one region
PAGE = mmap.PAGESIZE


def round_up(n: int, to: int) -> int:
    return -(-n // to) * to


@dataclass(frozen=True, slots=True)
class Region:
    """Where a slot's bytes live: `length` bytes at `offset` of memfd `fd` (in this process)."""

    fd: int
    offset: int
    length: int
    pooled: bool


def _memfd(nbytes: int, name: str) -> int:
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, max(nbytes, 1))
    except OSError:
        os.close(fd)
        raise
    return fd


def _view(mm: mmap.mmap, offset: int, nbytes: int, on_free) -> torch.Tensor:
    """A flat uint8 tensor over `mm[offset:offset+nbytes]`; `on_free` runs once no tensor views it any more."""
    arr = np.frombuffer(mm, dtype=np.uint8, count=nbytes, offset=offset)
    weakref.finalize(arr, on_free)  # torch keeps `arr` alive for as long as any view of the storage lives
    return torch.from_numpy(arr)


def fresh(nbytes: int) -> tuple[Region, torch.Tensor]:
    """A one-off memfd region, untouched (its pages fault in as they are first written)."""
    fd = _memfd(nbytes, "statefleet-slot")
    mm = mmap.mmap(fd, max(nbytes, 1))
    return Region(fd, 0, nbytes, False), _view(mm, 0, nbytes, lambda: os.close(fd))


class StagingPool:
    """One arena of `capacity` bytes, first-fit regions, coalesced on release. Thread-safe: regions come
    back from whichever thread drops the last tensor."""

    def __init__(self, capacity: int, *, pin: bool = False) -> None:
        self.capacity = round_up(max(capacity, 0), ALIGN)
        self.fd = _memfd(self.capacity, "statefleet-staging")
        self.mm = mmap.mmap(self.fd, max(self.capacity, 1), flags=mmap.MAP_SHARED | mmap.MAP_POPULATE)
        arena = np.frombuffer(self.mm, dtype=np.uint8)
        arena[::PAGE] = 0  # write-fault every page now, so no move ever does
        self.base_ptr = arena.ctypes.data
        self.pinned = pin and self.capacity > 0 and _pin(arena)
        del arena  # no view of the whole arena outlives __init__, so `close` can unmap it
        # The memfd keeps its pages as long as it is open, mapped or not: it is closed (and the arena
        # unpinned) by `close`, or when the pool is collected, whichever comes first.
        self._release = weakref.finalize(self, _release, self.fd, self.base_ptr if self.pinned else 0)
        self.free: list[tuple[int, int]] = [(0, self.capacity)] if self.capacity else []
        self.exposed: set[int] = set()  # offsets of regions a peer process mapped for a move still undecided
        self.quarantine: list[tuple[int, int]] = []  # freed while a peer may still map them
        self.inode = os.fstat(self.fd).st_ino
        self.lock = threading.Lock()
        self.closed = False

    def close(self) -> None:
        """Give the arena back (the endpoint stopped): its memfd now, its mapping now if no region is in
        use, else once the last tensor viewing it is freed. No region is handed out afterwards."""
        with self.lock:
            in_use = sum(n for _, n in self.free) < self.capacity
            self.free, self.closed = [], True
        self._release()
        if not in_use:
            with contextlib.suppress(BufferError):  # a view taken meanwhile keeps the mapping alive
                self.mm.close()

    @property
    def free_bytes(self) -> int:
        with self.lock:
            return sum(n for _, n in self.free)

    def expose(self, region: Region) -> None:
        """A peer maps `region` to write into it: if the region is freed before `settle`, it stays out of
        the pool until no other process maps it (a slow sender of a failed move must never write into the
        next move's slot)."""
        with self.lock:
            self.exposed.add(region.offset)

    def settle(self, region: Region) -> None:
        """The peer finished its writes (the move's last frame arrived): the region is ordinary again."""
        with self.lock:
            self.exposed.discard(region.offset)

    def take(self, nbytes: int) -> tuple[Region, torch.Tensor] | None:
        """A region of at least `nbytes` and a tensor over exactly `nbytes` of it; None when none fits."""
        need = round_up(max(nbytes, 1), ALIGN)
        self._sweep()
        off = self._first_fit(need)
        if off is None:
            return None
        return Region(self.fd, off, need, True), _view(self.mm, off, nbytes, lambda: self._released(off, need))

    def _first_fit(self, need: int) -> int | None:
        with self.lock:
            for i, (off, n) in enumerate(self.free):
                if n >= need:
                    self.free[i:i + 1] = [(off + need, n - need)] if n > need else []
                    return off
        return None

    def _sweep(self) -> None:
        """Return quarantined regions that no other process maps any more."""
        with self.lock:
            held = list(self.quarantine)
        if not held:
            return
        mapped = peer_mappings(self.inode, self.base_ptr)
        for off, n in held:
            if not any(o < off + n and off < o + k for o, k in mapped):
                with self.lock:
                    self.quarantine.remove((off, n))
                self._give_back(off, n)

    def _released(self, off: int, n: int) -> None:
        with self.lock:
            if off in self.exposed:
                self.exposed.discard(off)
                self.quarantine.append((off, n))
                return
        self._give_back(off, n)

    def _give_back(self, off: int, n: int) -> None:
        with self.lock:
            if self.closed:
                return
            spans = sorted([*self.free, (off, n)])
            merged: list[tuple[int, int]] = []
            for o, k in spans:
                if merged and merged[-1][0] + merged[-1][1] == o:
                    merged[-1] = (merged[-1][0], merged[-1][1] + k)
                else:
                    merged.append((o, k))
            self.free = merged


def _release(fd: int, pinned_ptr: int) -> None:
    if pinned_ptr:  # unpinned before it can be unmapped: unmapping registered memory is undefined in CUDA
        with contextlib.suppress(RuntimeError):
            torch.cuda.cudart().cudaHostUnregister(pinned_ptr)
    os.close(fd)


def peer_mappings(inode: int, own: int = 0) -> list[tuple[int, int]]:
    """(file offset, length) of every mapping of memfd `inode` this user can see, except the one at address
    `own` in this process (the pool's own view of its arena)."""
    me, out = os.getpid(), []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/maps") as f:
                for line in f:
                    fields = line.split(maxsplit=5)
                    if len(fields) >= 5 and fields[4] == str(inode):
                        lo, hi = (int(x, 16) for x in fields[0].split("-"))
                        if int(entry.name) == me and lo == own:
                            continue
                        out.append((int(fields[2], 16), hi - lo))
        except OSError:
            continue  # gone, or not ours to read
    return out


def _pin(arena: np.ndarray) -> bool:
    """Page-lock the arena for the GPU (cudaHostRegister), so host<->device copies from it run at full rate."""
    if not torch.cuda.is_available():
        return False
    rc = torch.cuda.cudart().cudaHostRegister(arena.ctypes.data, arena.nbytes, 0)
    if int(rc) == 0:
        return True
    # A failed registration stays this thread's last CUDA error, which the next kernel launched on this
    # thread would raise as its own: consume it with a launch of ours (the arena just stays unpinned).
    with contextlib.suppress(RuntimeError):
        torch.zeros(1, device="cuda")
    return False
