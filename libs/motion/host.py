"""The seam between state motion and an engine host: what the endpoint needs from the engine runtime."""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import Protocol

import torch


class StateHost(Protocol):
    device: torch.device

    def state_tree(self, session_id: str) -> dict:
        """The live tree: nested dict/list of torch tensors + scalar control values; raises NotFound."""
        ...

    def block_boundary(self, session_id: str) -> AbstractAsyncContextManager[None]:
        """While held, no block of that session runs; raises NotFound."""
        ...

    def session_descriptor(self, session_id: str) -> bytes:
        """Opaque engine-defined bytes (backend, seed, tier, cursor...) that travel with the state."""
        ...

    async def install_state(self, session_id: str, tree: dict, descriptor: bytes) -> None:
        """Atomically make the verified `tree` (already on self.device) the session's live state,
        creating the session if the host does not hold it."""
        ...

    async def drop_session(self, session_id: str) -> None:
        """The source releases its copy after a committed move."""
        ...
