"""State trees: nested dicts/lists of torch tensors and scalar control values.

A tree is split into a *skeleton* (the same nesting, each tensor replaced by a
`{"$leaf": i}` marker, scalars kept) and its list of tensor leaves, so the
skeleton travels as msgpack and the leaves as raw bytes.
"""

from __future__ import annotations

from typing import Any

import torch

from libs.errors import BadRequest

LEAF = "$leaf"
Scalar = (int, float, bool, str)


def split(tree: Any) -> tuple[Any, list[torch.Tensor]]:
    leaves: list[torch.Tensor] = []

    def walk(node: Any, path: str) -> Any:
        if isinstance(node, torch.Tensor):
            leaves.append(node)
            return {LEAF: len(leaves) - 1}
        if isinstance(node, dict):
            if LEAF in node or not all(isinstance(k, str) for k in node):
                raise BadRequest(f"state tree dict at {path or '/'} has a reserved or non-string key", path=path)
            return {k: walk(v, f"{path}/{k}") for k, v in node.items()}
        if isinstance(node, (list, tuple)):
            return [walk(v, f"{path}/{i}") for i, v in enumerate(node)]
        if isinstance(node, Scalar) or node is None:
            return node
        raise BadRequest(f"state tree leaf at {path} is a {type(node).__name__}", path=path)

    return walk(tree, ""), leaves


def join(skeleton: Any, leaves: list[torch.Tensor]) -> Any:
    if isinstance(skeleton, dict):
        if LEAF in skeleton:
            return leaves[skeleton[LEAF]]
        return {k: join(v, leaves) for k, v in skeleton.items()}
    if isinstance(skeleton, list):
        return [join(v, leaves) for v in skeleton]
    return skeleton


def tensors(tree: Any) -> list[torch.Tensor]:
    return split(tree)[1]


def tree_bytes(tree: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tensors(tree))


def clone_tree(tree: Any, device: torch.device | str | None = None, *, pin: bool = False) -> Any:
    """A deep copy with every tensor in fresh memory (on `device` if given; pinned host memory if `pin`)."""
    skeleton, leaves = split(tree)
    out = []
    for t in leaves:
        target = torch.device(device) if device is not None else t.device
        copy = torch.empty(t.shape, dtype=t.dtype, device=target, pin_memory=pin and target.type == "cpu")
        copy.copy_(t, non_blocking=pin)
        out.append(copy)
    # Each device the copies came from, not this thread's current device (cuda:0 in a worker thread): the
    # host must not read pinned memory an engine host on cuda:1 is still copying into.
    for d in {t.device for t in leaves if pin and t.device.type == "cuda"}:
        torch.cuda.synchronize(d)
    return join(skeleton, out)


def trees_equal(a: Any, b: Any) -> bool:
    """Same skeleton, and every tensor identical in dtype, shape and bytes."""
    sa, la = split(a)
    sb, lb = split(b)
    if sa != sb or len(la) != len(lb):
        return False
    return all(x.dtype == y.dtype and x.shape == y.shape and torch.equal(x.cpu(), y.cpu()) for x, y in zip(la, lb, strict=True))


def byte_view(t: torch.Tensor) -> memoryview:
    """The tensor's bytes (CPU, contiguous) as a flat buffer, without copying when already so."""
    t = t.detach().cpu().contiguous()
    return memoryview(t.reshape(-1).view(torch.uint8).numpy()) if t.numel() else memoryview(b"")
