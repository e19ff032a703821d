"""Whether a move sends a backend's `rebuildable` leaves or leaves them to the destination's rebuild.

The role says a leaf *can* be re-derived; whether that is cheaper than sending it depends on the
host. A rebuild replays model work (the dit decoder over its latent history), a send costs the
leaves' bytes at the wire rate. On a CPU host a replay can cost far more than the bytes (see
docs/backends.md), on a GPU host over a slow link far less. The host measures each rebuild it runs
(seeded by one timed at start-up in the profile) and sends the leaves once the measured rebuild
takes longer than their bytes at `wire_bps`. With nothing measured it keeps the declared role.
The choice travels in the moved session's descriptor (`sent_roles`), so the destination knows
whether to rebuild. A measurement that tips the choice between a move's `register_state` and its
`migrate` makes the sent state larger or smaller than the one admitted; the move then fails closed
like any other mismatch, and the next one is consistent. Checkpoints always keep only the `moved`
leaves: they are sized for storage.
"""

from __future__ import annotations

from typing import Literal

from services.engine_host.backends import Backend
from services.engine_host.backends import spec as specs
from services.engine_host.costs import shape_of

RebuildPolicy = Literal["auto", "rebuild", "send"]
MOVED: tuple[specs.Role, ...] = ("moved",)
WITH_REBUILDABLE: tuple[specs.Role, ...] = ("moved", "rebuildable")
EWMA = 0.3


class RebuildChoice:
    def __init__(self, policy: RebuildPolicy = "auto", wire_bps: float = 1.25e9) -> None:
        self.policy = policy
        self.wire_bps = wire_bps
        self._rebuild_s: dict[str, float] = {}  # by backend shape (name and config)

    def observe(self, backend: Backend, seconds: float) -> None:
        """A rebuild of one session of `backend` took `seconds` here."""
        key = shape_of(backend)
        old = self._rebuild_s.get(key)
        self._rebuild_s[key] = seconds if old is None else (1 - EWMA) * old + EWMA * seconds

    def rebuild_s(self, backend: Backend) -> float | None:
        return self._rebuild_s.get(shape_of(backend))

    def send_s(self, backend: Backend) -> float:
        """What sending the rebuildable leaves would add to a move at the assumed wire rate."""
        return specs.tensor_bytes(backend.state_spec(), "rebuildable") / self.wire_bps

    def roles(self, backend: Backend) -> tuple[specs.Role, ...]:
        """The roles a move of a `backend` session sends from this host."""
        if self.policy == "rebuild" or not specs.tensor_bytes(backend.state_spec(), "rebuildable"):
            return MOVED
        if self.policy == "send":
            return WITH_REBUILDABLE
        measured = self.rebuild_s(backend)
        return WITH_REBUILDABLE if measured is not None and measured > self.send_s(backend) else MOVED
