"""Placement messages: `sf.placement.place` asks for an engine host for an admitted session."""

from __future__ import annotations

from typing import Literal

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
    # Only these hosts (admission's ramp lets their devices take the session now); empty: any host.
    hosts: list[str] = []


class Placement(Msg):
    session_id: str
    host_id: str
    estimate: Estimate  # the arithmetic on the chosen host, from its own heartbeat and profile rows
    incarnation: str = ""  # the host process the session is reserved on (the assign names it)


# ---------------------------------------------------------------- capacity reservations (KV `sf_capacity`)

HostState = Literal["up", "draining", "drained"]


class Reserved(Msg):
    """One session's claim on a host's capacity, made by compare-and-set before it is assigned there."""

    busy_fraction: float
    state_bytes: int
    at: float  # when it was reserved (placer's clock): it counts until a heartbeat this much newer shows it
    incarnation: str = ""  # the host process it was reserved on; a death of that process releases it


class HostRecord(Msg):
    """A host's lifecycle state and its reservations: one KV entry per host, updated only by CAS on its
    revision, so two placers never both take the last room on a host."""

    host_id: str
    state: HostState = "up"
    incarnation: str = ""  # the latest process placement has seen for this host
    sessions: dict[str, Reserved] = {}


# ---------------------------------------------------------------- host lifecycle (`sf.placement.hosts|drain|undrain`)

HOST_ID_PATTERN = "^[A-Za-z0-9_-]{1,64}$"  # host ids are subject tokens
HostLiveness = Literal["up", "draining", "drained", "dead"]
DrainOutcome = Literal["moved", "handed_over", "no_room", "failed"]


class HostsRequest(Msg):
    pass


class HostInfo(Msg):
    host_id: str
    state: HostLiveness
    incarnation: str = ""
    sessions: int = 0  # sessions fence says this host owns
    reserved: int = 0  # reservations held on it
    busy_fraction: float = 0.0  # measured, from its last heartbeat
    heartbeat_age_s: float = 0.0


class HostList(Msg):
    hosts: list[HostInfo]


class HostRequest(Msg):
    """`drain` / `undrain` one host."""

    host_id: str


class SessionOutcome(Msg):
    """What drain did with one session: live-moved (`moved`), handed over by checkpoint + replay because its
    live move was inadmissible or failed (`handed_over`), left in place for want of room (`no_room`), or `failed`."""

    session_id: str
    outcome: DrainOutcome
    dest: str = ""
    detail: str = ""


class DrainReport(Msg):
    host_id: str
    state: HostLiveness
    outcomes: list[SessionOutcome] = []
    remaining: int = 0  # sessions fence still says the host owns (0 once drained)


# ---------------------------------------------------------------- the fleet controller's tenure (KV `sf_placement_lease`)


class Tenure(Msg):
    """Who acts as the fleet controller (rebalancer, autoscaler, idle offload) until when (holder's wall clock).

    Taken and renewed only by compare-and-set on the key's revision: two placement instances never
    both believe they hold it for longer than the skew between their clocks."""

    holder: str
    expires_at: float
