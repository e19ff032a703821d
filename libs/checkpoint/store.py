"""The one checkpoint store: small states in the NATS Object Store, multi-GB ones on a filesystem path.

A checkpoint is a data blob (every tensor leaf's bytes, back to back) and a
manifest (the tree's skeleton, each leaf's dtype/shape/offset/CRC32C, and the
caller's opaque descriptor). The manifest always lives in the Object Store and
is written last, so it is the commit point: a checkpoint whose manifest is
readable is complete, and every leaf is re-verified against its CRC on read.
The filesystem path must be shared by the hosts that may restore (NFS, a
mounted bucket); the blob is written to a temp name, fsynced, then renamed.
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from pathlib import Path
from typing import Any, Literal

import crc32c
import msgspec
import torch

from libs import bus
from libs.checkpoint.tree import byte_view, join, split
from libs.errors import BadRequest, ConfigError, IntegrityError, NotFound
from libs.schemas.base import Msg, decode, encode

KEY_RE = re.compile(r"[A-Za-z0-9_.-]{1,200}")  # fullmatch only: `$` admits a trailing newline
DEFAULT_INLINE_MAX_BYTES = 64 << 20


class LeafEntry(Msg):
    dtype: str
    shape: list[int]
    offset: int
    nbytes: int
    crc32c: int


class CheckpointManifest(Msg):
    key: str
    location: Literal["object", "file"]
    skeleton: bytes  # msgpack of the tree with tensors replaced by leaf markers
    leaves: list[LeafEntry]
    descriptor: bytes
    total_bytes: int
    created_at: float


def _dtype(name: str) -> torch.dtype:
    dt = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dt, torch.dtype):
        raise IntegrityError(f"checkpoint names an unknown dtype {name}", dtype=name)
    return dt


class CheckpointStore:
    """put / get / delete / manifest of checkpoints by key; the location is chosen by size."""

    def __init__(self, objects: bus.ObjectStore, root: Path | str | None = None,
                 *, inline_max_bytes: int = DEFAULT_INLINE_MAX_BYTES) -> None:
        self.objects = objects
        self.root = Path(root) if root is not None else None
        self.inline_max_bytes = inline_max_bytes

    # ------------------------------------------------------------ write

    async def put(self, key: str, tree: dict, descriptor: bytes, *, copy: bool = True) -> CheckpointManifest:
        """Store `tree`; with `copy=False` the caller promises its host tensors stay unchanged meanwhile."""
        _check_key(key)
        skeleton, leaves = split(tree)
        total = sum(t.numel() * t.element_size() for t in leaves)
        location: Literal["object", "file"] = "object" if total <= self.inline_max_bytes else "file"
        if location == "file" and self.root is None:
            raise ConfigError(f"checkpoint of {total} bytes needs a filesystem root; none configured",
                              key=key, total_bytes=total)
        # Leaves are copied to host memory first: a consistent snapshot the caller may keep mutating after.
        host = await asyncio.to_thread(lambda: [t.detach().to("cpu", copy=copy).contiguous() for t in leaves])
        entries = await asyncio.to_thread(_entries, host)
        if location == "object":
            await self.objects.put(f"{key}.data", await asyncio.to_thread(_concat, host))
        else:
            await asyncio.to_thread(self._write_file, key, host)
        manifest = CheckpointManifest(key=key, location=location, skeleton=msgspec.msgpack.encode(skeleton),
                                      leaves=entries, descriptor=descriptor, total_bytes=total,
                                      created_at=time.time())
        await self.objects.put(f"{key}.manifest", encode(manifest))
        return manifest

    def _path(self, key: str) -> Path:
        assert self.root is not None
        return self.root / f"{key}.ckpt"

    def _write_file(self, key: str, host: list[torch.Tensor]) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        with open(tmp, "wb") as f:
            for t in host:
                f.write(byte_view(t))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    # ------------------------------------------------------------ read

    async def manifest(self, key: str) -> CheckpointManifest:
        _check_key(key)
        data = await bus.read_object(self.objects, f"{key}.manifest", what="a checkpoint manifest", key=key)
        if data is None:
            raise NotFound(f"no checkpoint {key}", key=key)
        return decode(data, CheckpointManifest)

    async def get(self, key: str, device: torch.device | str = "cpu") -> tuple[dict, bytes]:
        """The tree (verified leaf by leaf, then moved to `device`) and its descriptor."""
        m = await self.manifest(key)
        if m.location == "object":
            data = await bus.read_object(self.objects, f"{key}.data", what="checkpoint data", key=key)
            if data is None:
                raise IntegrityError(f"checkpoint {key} has a manifest but no data", key=key)
            blob: Any = bytearray(data)
        else:
            if self.root is None:
                raise ConfigError(f"checkpoint {key} is on a filesystem; none configured", key=key)
            blob = await asyncio.to_thread(self._read_file, key, m.total_bytes)
        leaves = await asyncio.to_thread(_verified_leaves, key, m, blob, torch.device(device))
        return join(msgspec.msgpack.decode(m.skeleton), leaves), m.descriptor

    def _read_file(self, key: str, total: int) -> bytearray:
        try:
            with open(self._path(key), "rb") as f:
                blob = bytearray(total)
                n = f.readinto(blob)
                extra = f.read(1)
        except FileNotFoundError:
            raise IntegrityError(f"checkpoint {key} has a manifest but no data file", key=key) from None
        if n != total or extra:
            raise IntegrityError(f"checkpoint {key} data is {n}{'+' if extra else ''} bytes, manifest says {total}",
                                 key=key)
        return blob

    async def delete(self, key: str) -> None:
        m = await self.manifest(key)
        await self.objects.delete(f"{key}.manifest")
        if m.location == "object":
            await self.objects.delete(f"{key}.data")
        else:
            await asyncio.to_thread(self._path(key).unlink, True)


def _check_key(key: str) -> None:
    if not KEY_RE.fullmatch(key):
        raise BadRequest(f"checkpoint key {key!r} must match {KEY_RE.pattern}", key=key)


def _entries(host: list[torch.Tensor]) -> list[LeafEntry]:
    out, offset = [], 0
    for t in host:
        buf = byte_view(t)
        out.append(LeafEntry(dtype=str(t.dtype).removeprefix("torch."), shape=list(t.shape), offset=offset,
                             nbytes=len(buf), crc32c=crc32c.crc32c(buf)))
        offset += len(buf)
    return out


def _concat(host: list[torch.Tensor]) -> bytes:
    return b"".join(bytes(byte_view(t)) for t in host)


def _verified_leaves(key: str, m: CheckpointManifest, blob: bytearray, device: torch.device) -> list[torch.Tensor]:
    if len(blob) != m.total_bytes:
        raise IntegrityError(f"checkpoint {key} data is {len(blob)} bytes, manifest says {m.total_bytes}", key=key)
    raw = torch.frombuffer(blob, dtype=torch.uint8) if blob else torch.empty(0, dtype=torch.uint8)
    out = []
    for i, e in enumerate(m.leaves):
        chunk = raw[e.offset:e.offset + e.nbytes]
        if crc32c.crc32c(memoryview(chunk.numpy())) != e.crc32c:
            raise IntegrityError(f"checkpoint {key} leaf {i} fails its CRC32C", key=key, leaf=i)
        # clone: a fresh, aligned buffer, so the dtype view never depends on the previous leaves' sizes
        out.append(chunk.clone().view(_dtype(e.dtype)).reshape(e.shape).to(device))
    return out
