"""The typed fleet snapshot every policy reads: hosts, sessions, path rates and the clock.

A snapshot is a value: the service builds one from its caches (engine heartbeats, the
session table, the mover's path-rate EWMA) and the simulator builds one from its model
fleet. Policies never mutate it; they return actions (`actions.py`) for the caller to apply.
"""

from __future__ import annotations

import math
from typing import Literal

import msgspec

from libs.contracts import Contract, Demand
from libs.schemas.common import EngineEntry, ShedKind

HostState = Literal["up", "draining", "drained", "dead"]
SessionState = Literal["queued", "serving", "moving", "suspended"]
# Why a suspended session was suspended, where that was to relieve a device measured past its limit
# (`overload.py`): "overload" resumes when input asks for it, as an idle one does; "capacity_lost" (a C1
# no device could keep) is re-queued: it resumes as soon as a device has room, input or not.
Shed = ShedKind


# Snapshot structs hold no reference cycles, so the garbage collector need not track them (gc=False):
# a snapshot of 10⁴ sessions then adds nothing to the collector's full passes.


class Host(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One engine host: its heartbeat (capacity, profile rows, measured load) and what placement knows besides."""

    entry: EngineEntry
    state: HostState = "up"
    zone: str = ""  # hosts in one zone (rack) talk at their NIC rate; across zones at `PathRates.cross_zone_bps`
    nic_bps: float = 0.0  # measured rate of this host's data plane; 0: `PathRates.default_bps`
    reserved: tuple[Demand, ...] = ()  # placements and incoming moves its heartbeat does not show yet
    moves_in: int = 0  # moves now in flight towards this host

    @property
    def host_id(self) -> str:
        return self.entry.host_id


class Session(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    session_id: str
    backend: str
    contract: Contract
    state: SessionState
    host_id: str = ""  # "" while queued; the host that holds it (or held it, when suspended)
    state_bytes: int = 0
    dirty_rate_bps: float = 0.0  # bytes/s it rewrites while generating (pre-copy must outrun it)
    last_input_at: float = 0.0
    suspended_at: float = 0.0  # meaningful while suspended: input after this wants a resume
    moves: tuple[float, ...] = ()  # times of its recent moves (the window bound counts these)
    # The torch intra-op threads a T0/T1 session's blocks run at (`OpenSession.threads`): its bytes replay
    # the same only at that count, so placement prefers hosts announcing it (`EngineEntry.threads`). 0: any.
    threads: int = 0
    shed: Shed = ""  # meaningful while suspended


class PathRates(msgspec.Struct, frozen=True, kw_only=True):
    """The measured per-path rate matrix, stored sparsely: NIC rates, a cross-zone rate, measured pairs."""

    default_bps: float
    cross_zone_bps: float = math.inf
    pairs: dict[str, float] = {}  # "src>dst" → measured bytes/s (EWMA of completed moves)

    def rate(self, src: Host, dst: Host) -> float:
        measured = self.pairs.get(f"{src.host_id}>{dst.host_id}")
        if measured is not None:
            return measured
        nic = min(src.nic_bps or self.default_bps, dst.nic_bps or self.default_bps)
        return nic if src.zone == dst.zone else min(nic, self.cross_zone_bps)


class Fleet(msgspec.Struct, frozen=True, kw_only=True):
    now: float
    hosts: tuple[Host, ...]
    sessions: tuple[Session, ...]
    paths: PathRates
    provisioning: int = 0  # hosts asked for and not up yet
    arrivals_per_s: float = 0.0  # recent rate of new sessions (the service measures it over a minute or so)
    # the highest such rate over a longer memory (0: unknown, arrivals_per_s stands in): waves recur, and
    # the pool a scale-out's lead time needs is sized for the last one rather than for the lull after it
    arrivals_peak_per_s: float = 0.0
    last_scale_out_at: float = -math.inf
    last_scale_in_at: float = -math.inf
