"""The shadow slot: where an incoming copy is staged on the destination, apart from the live state.

A slot moves one way through its states and only a `VerifiedState` (built by
`verify` from a full re-fingerprint that matched the manifest) can be
installed, so a half-migrated state has no representation the host could make
live: until `commit`, the host's live tree is never touched; after a failure
the slot is dropped whole.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass
from enum import Enum

import torch

from libs.errors import BadRequest, Conflict, IntegrityError, TooLarge
from libs.motion import checksum, crc, manifest, pool
from libs.schemas.motion import Manifest

LEAF_ALIGN = 64  # every leaf starts on a cache line (and on any dtype's alignment) within the slot's region


class SlotState(Enum):
    ARMED = "armed"  # admitted, token issued, no bytes yet
    RECEIVING = "receiving"
    RECEIVED = "received"  # every chunk arrived and matched its CRC
    VERIFIED = "verified"
    FAILED = "failed"


def chunks_of(nbytes: int, chunk_bytes: int) -> list[tuple[int, int]]:
    return [(off, min(chunk_bytes, nbytes - off)) for off in range(0, nbytes, chunk_bytes)]


@dataclass(frozen=True, slots=True)
class VerifiedState:
    """A staged copy whose bytes re-fingerprinted to `manifest`; the only thing `commit` installs."""

    tree: dict
    manifest: Manifest


class ShadowSlot:
    def __init__(self, session_id: str, move_id: str, token: str, state_bytes: int, device: torch.device,
                 lease_s: float, staging: pool.StagingPool | None = None) -> None:
        self.session_id, self.move_id, self.token = session_id, move_id, token
        self.state_bytes = state_bytes
        self.device = device
        self.expires_at = time.monotonic() + lease_s
        self.state = SlotState.ARMED
        self.reason = ""
        self.layout: Manifest | None = None
        self.chunk_bytes = 0
        self.tensors: list[torch.Tensor] = []
        self.flats: list[torch.Tensor] = []
        self.chunk_crcs: list[list[int | None]] = []
        self.verified: VerifiedState | None = None
        self.pool = staging
        self.memory: pool.Region | None = None  # host slots: the memfd region holding the staged leaves
        self.leaf_offsets: list[int] = []  # each leaf's byte offset within `memory`
        self.staging = ""  # "pool", or "fresh: <why>": what the receipt reports
        self.checksum = checksum.CRC32C  # what each chunk's and leaf's value is (set before the first chunk)
        self.done = asyncio.Event()  # set once RECEIVED or FAILED

    @property
    def expired(self) -> bool:
        return time.monotonic() > self.expires_at

    def open(self, layout: Manifest, chunk_bytes: int) -> None:
        """Allocate the staged tensors for `layout`; refuses a layout larger than what was admitted."""
        if self.state is not SlotState.ARMED:
            raise Conflict(f"slot for move {self.move_id} is {self.state.value}, not armed", move_id=self.move_id)
        if layout.session_id != self.session_id:
            raise BadRequest("layout is for another session", session_id=layout.session_id)
        if layout.total_bytes != self.state_bytes:
            raise TooLarge(f"layout holds {layout.total_bytes} bytes, admitted {self.state_bytes}",
                           move_id=self.move_id)
        if not 0 < chunk_bytes <= 1 << 30:
            raise BadRequest(f"chunk_bytes {chunk_bytes} out of range")
        meta = [(leaf.dtype, list(leaf.shape)) for leaf in layout.leaves]
        if sum(leaf.nbytes for leaf in layout.leaves) != layout.total_bytes or \
                manifest.topology([leaf.path for leaf in layout.leaves], meta) != layout.topology:
            raise BadRequest("layout is inconsistent with its topology", move_id=self.move_id)
        for leaf in layout.leaves:
            dtype = manifest.dtype_of(leaf.dtype)
            if any(d < 0 for d in leaf.shape) or math.prod(leaf.shape) * dtype.itemsize != leaf.nbytes:
                raise BadRequest(f"leaf {leaf.path}: nbytes does not match shape×dtype", path=leaf.path)
        for leaf, t in zip(layout.leaves, self._allocate(layout), strict=True):
            self.tensors.append(t)
            self.flats.append(crc.byte_view(t))
            self.chunk_crcs.append([None] * len(chunks_of(leaf.nbytes, chunk_bytes)))
        self.layout, self.chunk_bytes = layout, chunk_bytes
        self.state = SlotState.RECEIVING

    def _allocate(self, layout: Manifest) -> list[torch.Tensor]:
        """The staged leaves: on the device for device slots (the caching allocator reuses its memory),
        otherwise carved from one memfd region, taken from the staging pool when it has room."""
        dtypes = [manifest.dtype_of(leaf.dtype) for leaf in layout.leaves]
        if self.device.type != "cpu":
            self.staging = "device"
            return [torch.empty(leaf.shape, dtype=dt, device=self.device) for leaf, dt in zip(layout.leaves, dtypes,
                                                                                             strict=True)]
        offsets, end = [], 0
        for leaf in layout.leaves:
            offsets.append(end)
            end = pool.round_up(end + leaf.nbytes, LEAF_ALIGN)
        got = self.pool.take(end) if self.pool is not None else None
        if got is not None:
            self.staging = "pool"
        else:
            self.staging = ("fresh: no staging pool configured" if self.pool is None else
                            f"fresh: the staging pool has {self.pool.free_bytes} bytes free of {self.pool.capacity}, "
                            f"this move needs {end}")
            got = pool.fresh(end)
        self.memory, whole = got
        self.leaf_offsets = offsets
        return [whole[off:off + leaf.nbytes].view(dt).reshape(leaf.shape)
                for off, leaf, dt in zip(offsets, layout.leaves, dtypes, strict=True)]

    def region(self, leaf: int, offset: int, length: int) -> torch.Tensor:
        """The staged bytes a chunk may write; anything outside the layout's chunk grid is refused."""
        if self.state is not SlotState.RECEIVING:
            raise Conflict(f"slot is {self.state.value}, not receiving", move_id=self.move_id)
        if not 0 <= leaf < len(self.flats):
            raise IntegrityError(f"chunk for leaf {leaf} of {len(self.flats)}", move_id=self.move_id)
        nbytes = self.flats[leaf].numel()
        if offset % self.chunk_bytes or offset >= max(nbytes, 1) or length != min(self.chunk_bytes, nbytes - offset):
            raise IntegrityError(f"chunk at leaf {leaf} offset {offset} length {length} is off the chunk grid",
                                 move_id=self.move_id)
        return self.flats[leaf][offset:offset + length]

    def record(self, leaf: int, offset: int, staged_crc: int) -> None:
        self.chunk_crcs[leaf][offset // self.chunk_bytes] = staged_crc

    def finish(self) -> int:
        """Every chunk arrived: the digest of the staged leaf CRCs (combined from the chunk CRCs)."""
        if self.state is not SlotState.RECEIVING:
            raise Conflict(f"slot is {self.state.value}, not receiving", move_id=self.move_id)
        missing = sum(c is None for crcs in self.chunk_crcs for c in crcs)
        if missing:
            raise IntegrityError(f"{missing} chunks never arrived", move_id=self.move_id)
        self.state = SlotState.RECEIVED
        self.done.set()
        return staged_digest(self.staged_leaf_crcs(), self.checksum)

    def staged_leaf_crcs(self) -> list[int]:
        out = []
        for flat, crcs in zip(self.flats, self.chunk_crcs, strict=True):
            lengths = [n for _, n in chunks_of(flat.numel(), self.chunk_bytes)]
            out.append(checksum.combine(self.checksum, crcs, lengths))  # type: ignore[arg-type]
        return out

    def fail(self, reason: str) -> None:
        if self.state is SlotState.VERIFIED:
            return
        if self.state is not SlotState.FAILED:
            self.state, self.reason = SlotState.FAILED, reason
        self.tensors, self.flats = [], []  # the staged bytes are dropped at once
        self.done.set()

    def release(self) -> None:
        """The endpoint is done with this slot (installed or dropped): it holds no staged memory any more,
        so an installed state's memory is owned by the host alone and goes back to the pool with it."""
        self.tensors, self.flats, self.verified = [], [], None

    async def verify(self, expected: Manifest, *, full: bool = True) -> VerifiedState:
        """Fingerprint the staged copy and bind it to `expected`, or fail the slot.

        `full`: re-read every staged byte (what `commit` does). Otherwise the leaf CRCs
        come from the chunk CRCs the receiver computed over the staged memory as each
        chunk landed; the slot takes no writes once received, so both describe the
        same bytes.
        """
        if self.state not in (SlotState.RECEIVED, SlotState.VERIFIED):
            raise Conflict(f"slot is {self.state.value}: {self.reason or 'nothing staged'}", move_id=self.move_id)
        assert self.layout is not None
        manifest.check_consistent(expected)
        if expected.topology != self.layout.topology or expected.session_id != self.session_id:
            self.fail("manifest does not match the staged layout")
            raise IntegrityError(self.reason, move_id=self.move_id)
        if expected.checksum != self.checksum:
            self.fail(f"the manifest's leaves carry {expected.checksum} values, the staged chunks {self.checksum}")
            raise IntegrityError(self.reason, move_id=self.move_id)
        got = await manifest.leaf_crcs(self.tensors, self.checksum) if full else self.staged_leaf_crcs()
        bad = [leaf.path for leaf, c in zip(expected.leaves, got, strict=True) if leaf.crc32c != c]
        if bad:
            self.fail(f"{len(bad)} leaves differ from the manifest (first: {bad[0]})")
            raise IntegrityError(self.reason, move_id=self.move_id)
        tree = manifest.unflatten(expected.control, self.tensors)
        self.verified = VerifiedState(tree=tree, manifest=expected)
        self.state = SlotState.VERIFIED
        return self.verified


def staged_digest(leaf_crcs: list[int], kind: str = checksum.CRC32C) -> int:
    """The receiver's acknowledgement of what it staged: a CRC32C of its leaf values in order."""
    width = 8 if kind == checksum.DEVHASH else 4
    return crc.crc(b"".join(c.to_bytes(width, "little") for c in leaf_crcs))
