"""What a policy decision asks the service to do. The service only applies these; it decides nothing."""

from __future__ import annotations

import msgspec

from libs.schemas.common import ShedKind


class Place(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    session_id: str
    host_id: str
    busy_fraction: float  # the demand to reserve on the host until its heartbeat shows the session
    state_bytes: int


class Move(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """A live move, already found admissible on its path (unless the caller's gate said otherwise)."""

    session_id: str
    src: str
    dst: str
    busy_fraction: float  # its demand on the receiver, reserved there while the move runs
    state_bytes: int
    gain_ms: float  # Γ = L − L′ − η·κ; 0 for drain moves, which are owed rather than chosen
    t_migrate_s: float
    stall_ms: float  # κ: the predicted freeze at cut-over


class ScaleOut(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    count: int


class Drain(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    host_id: str


class StopHost(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    host_id: str  # owns no session and expects none: safe to stop


class Suspend(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    session_id: str
    host_id: str
    # "" (idle offload) | "overload" (a C2-C5 session shed from a device measured past its limit) |
    # "capacity_lost" (a C1 session no device can keep: suspended and waiting for room, said out loud)
    reason: ShedKind = ""


class Resume(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    session_id: str
    host_id: str  # where it resumes: its old host when that has room, else another
    busy_fraction: float
    state_bytes: int


Action = Place | Move | ScaleOut | Drain | StopHost | Suspend | Resume


class Refusal(msgspec.Struct, frozen=True, kw_only=True):
    """Something a policy wanted and could not do, with the reason (no_fit, inadmissible, ...)."""

    kind: str  # place | move | resume | drain
    session_id: str
    reason: str
    host_id: str = ""


class Scaling(msgspec.Struct, frozen=True, kw_only=True):
    """What the autoscaler saw in one decision: its load (busy fractions summed, queued sessions' included),
    the hosts it counts (open plus provisioning), their utilisation, and the host count it aims at."""

    load: float
    hosts: int
    util: float
    want: int
    pool: int
    idle_hosts: int
    queued: int


class Decision(msgspec.Struct, frozen=True, kw_only=True):
    actions: tuple[Action, ...]
    refusals: tuple[Refusal, ...] = ()
    scaling: Scaling | None = None  # with autoscaling on: why it scaled, or did not
