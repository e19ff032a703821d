"""Placement messages: `sf.placement.place` asks for an engine host for an admitted session."""

from __future__ import annotations

from libs.contracts import Contract, Estimate, Guard
from libs.schemas.base import Msg


class PlaceRequest(Msg):
    """Place an admitted session on the first engine host that fits it with `guard` kept free.

    Retrying with the same `session_id` returns the same host while the placement is pending.
    A session no host fits is answered with `Rejected` (`reason="no_fit"`, `hosts` = "id:reason,...").
    """

    session_id: str
    backend: str
    contract: Contract
    guard: Guard = Guard()


class Placement(Msg):
    session_id: str
    host_id: str
    estimate: Estimate  # the arithmetic on the chosen host, from its own heartbeat and profile rows
