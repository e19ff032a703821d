"""The fleet controller's side of the shared stack (issue 22: shared from here, not from tests/fleet/conftest.py):
which placement instance holds the fleet lease, its settings, and what an engine host holds of a session."""

from __future__ import annotations

from libs import bus, names
from libs.schemas.engine import Advance, SessionInfo
from libs.schemas.motion import Manifest, RegisterState
from tests.support.stack import Stack


def holder(stack: Stack):
    """The placement instance holding the fleet tenure (None while none does)."""
    return next((p for p in stack.placements if p.fleet.tenure.held), None)


def configure(stack: Stack, **fields) -> None:
    """Change the controller's settings on every placement instance (read afresh every round)."""
    for p in stack.placements:
        for k, v in fields.items():
            setattr(p.config, k, v)


async def fingerprint(stack: Stack, host_id: str, sid: str) -> int:
    """The whole-state CRC32C of the session's live tree at a block boundary (the mover's manifest)."""
    m = await bus.request(stack.nc, names.engine_subject(host_id, "register_state"),
                          RegisterState(session_id=sid), Manifest, timeout_s=10)
    return m.fingerprint


async def advance(stack: Stack, host_id: str, sid: str, blocks: int) -> SessionInfo:
    return await bus.request(stack.nc, names.engine_subject(host_id, "advance"),
                             Advance(session_id=sid, blocks=blocks), SessionInfo, timeout_s=30)
