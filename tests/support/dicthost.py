"""A small real StateHost for tests: live trees in a dict, one asyncio lock per session as the block boundary.

`step` is a deterministic "world model" block: it rewrites a window of ~3/4 of
every float leaf from the current state (the window moves with the cursor),
bumps integer leaves, advances the cursor and returns the block's output bytes.
"""

from __future__ import annotations

import asyncio

import torch

from libs.errors import NotFound
from libs.motion import crc


def make_tree(seed: int, leaf_bytes: int = 64 << 10, layers: int = 3) -> dict:
    g = torch.Generator().manual_seed(seed)
    cols = 64

    def floats(dtype: torch.dtype) -> torch.Tensor:
        rows = max(4, leaf_bytes // (cols * dtype.itemsize))
        return torch.randn(rows, cols, generator=g).to(dtype)

    return {
        "kv": [{"k": floats(torch.bfloat16), "v": floats(torch.float16)} for _ in range(layers)],
        "latent": floats(torch.float32),
        "tokens": torch.randint(0, 50_000, (max(1, leaf_bytes // 8),), generator=g, dtype=torch.int64),
        "mask": torch.rand(257, generator=g) > 0.5,
        "scalar": torch.tensor(3.5),
        "empty": torch.empty(0, 4),
        "control": {"cursor": 0, "backend": "window-world", "temperature": 0.7, "paused": False, "note": None},
    }


def _leaves(tree) -> list[torch.Tensor]:
    if isinstance(tree, torch.Tensor):
        return [tree]
    if isinstance(tree, dict):
        return [t for v in tree.values() for t in _leaves(v)]
    if isinstance(tree, list):
        return [t for v in tree for t in _leaves(v)]
    return []


def advance(tree: dict) -> bytes:
    """One block: rewrite ~3/4 of each float leaf in place; return the block's output bytes."""
    cursor = tree["control"]["cursor"]
    out = []
    for t in _leaves(tree):
        if t.is_floating_point() and t.dim() == 2 and t.shape[0] >= 4:
            rows = t.shape[0]
            n = (3 * rows) // 4
            idx = (torch.arange(n) + cursor * (rows // 4)) % rows
            src = t.float().roll(1, 0)[idx]
            t[idx] = torch.tanh(src * 0.9 + 0.01 * (cursor + 1)).to(t.dtype)
            out.append(t.float().mean(dim=1))
        elif t.dtype == torch.int64:
            t.add_(cursor + 1).remainder_(50_000)
    tree["control"]["cursor"] = cursor + 1
    return torch.cat(out).numpy().tobytes()


def tree_bytes(tree: dict) -> list[bytes]:
    return [crc.byte_view(t).cpu().numpy().tobytes() for t in _leaves(tree)]


class DictHost:
    def __init__(self, device: str = "cpu") -> None:
        self.device = torch.device(device)
        self.trees: dict[str, dict] = {}
        self.descriptors: dict[str, bytes] = {}
        self.locks: dict[str, asyncio.Lock] = {}
        self.installs = 0
        self.drops = 0

    def add(self, session_id: str, tree: dict, descriptor: bytes = b"") -> None:
        self.trees[session_id] = tree
        self.descriptors[session_id] = descriptor
        self.locks[session_id] = asyncio.Lock()

    def state_tree(self, session_id: str) -> dict:
        try:
            return self.trees[session_id]
        except KeyError:
            raise NotFound(f"no session {session_id}", session_id=session_id) from None

    def block_boundary(self, session_id: str) -> asyncio.Lock:
        self.state_tree(session_id)
        return self.locks[session_id]

    def session_descriptor(self, session_id: str) -> bytes:
        self.state_tree(session_id)
        return self.descriptors[session_id]

    async def install_state(self, session_id: str, tree: dict, descriptor: bytes) -> None:
        self.installs += 1
        self.locks.setdefault(session_id, asyncio.Lock())
        self.trees[session_id] = tree
        self.descriptors[session_id] = descriptor

    async def drop_session(self, session_id: str) -> None:
        self.drops += 1
        self.trees.pop(session_id, None)
        self.descriptors.pop(session_id, None)

    async def step(self, session_id: str) -> bytes:
        async with self.block_boundary(session_id):
            return advance(self.state_tree(session_id))

    async def run(self, session_id: str, stop: asyncio.Event, block_s: float = 0.002) -> int:
        """Generate blocks until `stop` (the session keeps running during pre-copy); returns blocks made."""
        n = 0
        while not stop.is_set() and session_id in self.trees:
            try:
                await self.step(session_id)
            except NotFound:  # moved away while we waited at the boundary
                break
            n += 1
            await asyncio.sleep(block_s)
        return n
