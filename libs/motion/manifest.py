"""Flatten a live state tree into leaves and bind it to a typed manifest.

A tree is nested dicts (str keys) and lists of torch tensors and scalar control
values (int, float, bool, str, None). Flattening yields the tensors in tree
order and a skeleton (msgpack) in which each tensor is replaced by its leaf
index, so the structure and every control value travel and hash with it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import msgspec
import torch

from libs.errors import BadRequest, IntegrityError
from libs.motion import checksum, crc, devhash
from libs.schemas.motion import Leaf, Manifest

_LEAF_EXT = 1
_SCALARS = (int, float, bool, str, type(None))
_enc = msgspec.msgpack.Encoder()


@dataclass(frozen=True, slots=True)
class Flat:
    paths: list[str]
    tensors: list[torch.Tensor]
    control: bytes


def flatten(tree: dict) -> Flat:
    if not isinstance(tree, dict):
        raise BadRequest(f"a state tree is a dict, got {type(tree).__name__}")
    paths: list[str] = []
    tensors: list[torch.Tensor] = []
    skeleton = _walk(tree, "", paths, tensors)
    return Flat(paths, tensors, _enc.encode(skeleton))


def _walk(node, path: str, paths: list[str], tensors: list[torch.Tensor]):
    """The skeleton of `node`, collecting its tensors. A module-level function rather than a closure: a
    recursive closure refers to itself, and that cycle would hold the flattened tensors (pooled memory,
    perhaps) until the next garbage collection instead of freeing them with the last reference."""
    if isinstance(node, torch.Tensor):
        paths.append(path)
        tensors.append(node)
        return msgspec.msgpack.Ext(_LEAF_EXT, (len(tensors) - 1).to_bytes(4, "little"))
    if isinstance(node, dict):
        for k in node:
            if not isinstance(k, str):
                raise BadRequest(f"state tree key {k!r} at '{path}' is not a str", path=path)
        return {k: _walk(v, f"{path}/{k}" if path else k, paths, tensors) for k, v in node.items()}
    if isinstance(node, (list, tuple)):
        return [_walk(v, f"{path}/{i}" if path else str(i), paths, tensors) for i, v in enumerate(node)]
    if isinstance(node, _SCALARS):
        return node
    raise BadRequest(f"state tree value at '{path}' has unsupported type {type(node).__name__}", path=path)


def unflatten(control: bytes, tensors: list[torch.Tensor]) -> dict:
    def ext_hook(code: int, data: memoryview):
        if code != _LEAF_EXT:
            raise IntegrityError(f"unknown extension {code} in a state skeleton")
        return tensors[int.from_bytes(data, "little")]

    try:
        return msgspec.msgpack.decode(control, ext_hook=ext_hook)
    except (msgspec.DecodeError, IndexError) as e:
        raise IntegrityError(f"state skeleton does not decode: {e}") from None


def dtype_name(dt: torch.dtype) -> str:
    return str(dt).removeprefix("torch.")


def dtype_of(name: str) -> torch.dtype:
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise BadRequest(f"unknown dtype {name!r}", dtype=name)
    return dt


def topology(paths: list[str], tensors_meta: list[tuple[str, list[int]]]) -> int:
    """Hash of the tensor structure: paths, dtypes, shapes (stable while a session generates)."""
    return crc.crc(_enc.encode([paths, tensors_meta]))


def whole_fingerprint(topo: int, control: bytes, leaf_crcs: list[int], kind: str = checksum.CRC32C) -> int:
    """The whole-state check: topology, the skeleton with its control values, every leaf value, and what
    kind of value they are where it is not CRC32C (so a value cannot pass for one of another kind)."""
    return crc.crc(_enc.encode([topo, control, leaf_crcs] + ([] if kind == checksum.CRC32C else [kind])))


def leaf_crc(t: torch.Tensor) -> int:
    return crc.crc_bytes(crc.byte_view(t))


_CRC_PIECE_BYTES = 32 << 20  # contiguous leaves are read in pieces, so one large leaf uses every worker


async def leaf_crcs(tensors: list[torch.Tensor], kind: str = checksum.CRC32C) -> list[int]:
    """Every leaf's CRC32C, computed on the worker pool: pieces of every leaf in parallel, then
    each leaf's piece CRCs combined. A device fingerprint (`kind`) is one job per leaf: its
    reductions run on the leaf's device."""
    loop = asyncio.get_running_loop()
    if kind == checksum.DEVHASH:
        return list(await asyncio.gather(*(loop.run_in_executor(crc.pool, devhash.fingerprint, crc.byte_view(t))
                                           for t in tensors)))

    def piece_crc(t: torch.Tensor, start: int, n: int) -> int:
        return crc.crc_bytes(crc.byte_view(t)[start:start + n])

    jobs, shapes = [], []
    for t in tensors:
        nbytes = t.numel() * t.element_size()
        if t.is_contiguous() and nbytes > _CRC_PIECE_BYTES:
            lengths = [min(_CRC_PIECE_BYTES, nbytes - s) for s in range(0, nbytes, _CRC_PIECE_BYTES)]
            jobs += [loop.run_in_executor(crc.pool, piece_crc, t, s, n)
                     for s, n in zip(range(0, nbytes, _CRC_PIECE_BYTES), lengths, strict=True)]
        else:
            lengths = [nbytes]
            jobs.append(loop.run_in_executor(crc.pool, leaf_crc, t))
        shapes.append(lengths)
    values = iter(await asyncio.gather(*jobs))
    return [crc.combine_all([next(values) for _ in lengths], lengths) for lengths in shapes]


def build(session_id: str, flat: Flat, crcs: list[int], *, tier: str = "T0", descriptor: bytes = b"",
          kind: str = checksum.CRC32C) -> Manifest:
    """The manifest of `flat` whose leaves have the values `crcs`, of `kind` (`libs.motion.checksum`)."""
    meta = [(dtype_name(t.dtype), list(t.shape)) for t in flat.tensors]
    topo = topology(flat.paths, meta)
    leaves = [Leaf(path=p, dtype=d, shape=s, nbytes=t.numel() * t.element_size(), crc32c=c)
              for p, (d, s), t, c in zip(flat.paths, meta, flat.tensors, crcs, strict=True)]
    return Manifest(session_id=session_id, leaves=leaves, control=flat.control, topology=topo,
                    fingerprint=whole_fingerprint(topo, flat.control, crcs, kind),
                    total_bytes=sum(x.nbytes for x in leaves), tier=tier, descriptor=descriptor, checksum=kind)


async def register(session_id: str, tree: dict, *, tier: str = "T0", descriptor: bytes = b"",
                   fingerprint: bool = True) -> Manifest:
    """Bind a live tree to its manifest. The caller holds the block boundary while this runs.

    `fingerprint=False` reads no tensor bytes: leaf CRCs and the fingerprint are 0, which
    `check_consistent` refuses, so such a manifest can size a move but never verify one."""
    flat = flatten(tree)
    if not fingerprint:
        m = build(session_id, flat, [0] * len(flat.tensors), tier=tier, descriptor=descriptor)
        return msgspec.structs.replace(m, fingerprint=0)
    return build(session_id, flat, await leaf_crcs(flat.tensors), tier=tier, descriptor=descriptor)


def check_consistent(m: Manifest) -> None:
    """A manifest whose own fields disagree (sizes, topology, fingerprint) is refused before any byte moves."""
    meta = []
    for leaf in m.leaves:
        dt = dtype_of(leaf.dtype)
        numel = 1
        for d in leaf.shape:
            if d < 0:
                raise BadRequest(f"negative dimension in leaf {leaf.path}", path=leaf.path)
            numel *= d
        if numel * dt.itemsize != leaf.nbytes:
            raise BadRequest(f"leaf {leaf.path}: nbytes {leaf.nbytes} != shape×dtype", path=leaf.path)
        meta.append((leaf.dtype, list(leaf.shape)))
    if m.checksum not in checksum.KINDS:
        raise BadRequest(f"unknown checksum kind {m.checksum!r}", session_id=m.session_id)
    topo = topology([x.path for x in m.leaves], meta)
    if topo != m.topology or whole_fingerprint(topo, m.control, [x.crc32c for x in m.leaves],
                                               m.checksum) != m.fingerprint:
        raise BadRequest("manifest topology or fingerprint does not match its leaves", session_id=m.session_id)
    if sum(x.nbytes for x in m.leaves) != m.total_bytes:
        raise BadRequest("manifest total_bytes does not match its leaves", session_id=m.session_id)
