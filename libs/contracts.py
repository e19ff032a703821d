"""Session contracts: what a session declares, which declarations are coherent, and what it costs a host.

A contract says what the fleet promises a session: its class (and with it a
period or deadline), the quality floor it may degrade to and no further, its
determinism tier and its decode tier. This module is pure: no I/O, no clock.

The cost of a contract on a host is computed from that host's own measured
`ProfileRow`s (never model constants): at the quality floor, one block costs
`block_ms` of device time (every stage it passes through: encode, denoise and
decode all run on the device, and the host learns that same stage sum while
serving), so a session that must finish `blocks_per_window` blocks in every
window (its period, or its deadline) takes a steady-state share
`blocks_per_window * block_ms / window_ms` of the device. Classes without a
window (bulk, replay without a deadline, maintenance) reserve no device share:
they run in the slack EDF leaves, and cost only their resident state and a slot.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Annotated

import msgspec

from libs import session_classes
from libs.schemas.common import EngineEntry, ProfileRow
from libs.session_classes import DecodeTier, DeterminismTier, SessionClass

# One hour: no period or deadline longer than this is a real-time promise.
MAX_WINDOW_MS = 3_600_000.0
WindowMs = Annotated[float, msgspec.Meta(gt=0, le=MAX_WINDOW_MS)]


class Contract(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """What a session asks of the fleet. Field names are what error messages name."""

    session_class: SessionClass
    quality_floor: Annotated[int, msgspec.Meta(ge=1, le=1024)]  # lowest quality tier (denoise steps)
    determinism: DeterminismTier
    decode_tier: DecodeTier = "full"
    period_ms: WindowMs | None = None  # C1: a block is due every period
    deadline_ms: WindowMs | None = None  # C2a/C2b (required), C3/C4 (optional): blocks due within it
    blocks_per_window: Annotated[int, msgspec.Meta(ge=1, le=1_000_000)] = 1

    @property
    def window_ms(self) -> float | None:
        return self.period_ms if self.period_ms is not None else self.deadline_ms

    @property
    def release_period_ms(self) -> float:
        """How often the engine releases a block of this session (0.0: only when asked)."""
        return session_classes.release_period_ms(self)


def check_coherence(contract: Contract, backend: str, tiers: Iterable[int]) -> None:
    """Raise `BadRequest` (reason `incoherent_contract`) naming the fields if `contract` cannot be meaningful for `backend`.

    `tiers` are the quality tiers the backend's profile rows offer (any host). The class's own
    rules are `session_classes.check`.
    """
    session_classes.check(contract)
    offered = sorted(set(tiers))
    if not offered:
        session_classes.reject(f"no engine host offers backend {backend!r}", "backend")
    if contract.quality_floor > offered[-1]:
        session_classes.reject(f"quality_floor {contract.quality_floor} is above backend {backend!r}'s best "
                               f"tier {offered[-1]}", "quality_floor", "backend", best_tier=offered[-1])


# ---------------------------------------------------------------- cost on a host

# Device shares are sums of floats: nine sessions of 0.1 must fill a 0.9 budget, not miss it by 1e-16.
_EPS = 1e-9


# The window over which an engine host measures its device time (`EngineEntry.measured_fraction`): long
# enough to hold several blocks of a 67 ms period, short enough to see an overload within a few heartbeats.
# A session that left its device still counts in that device's measured load for up to this long.
MEASURE_WINDOW_S = 2.0


class Guard(msgspec.Struct, kw_only=True, frozen=True):
    """Headroom every host keeps free, and its retained-session slots."""

    busy_fraction: Annotated[float, msgspec.Meta(ge=0, lt=1)] = 0.1
    memory_fraction: Annotated[float, msgspec.Meta(ge=0, lt=1)] = 0.05
    max_sessions: Annotated[int, msgspec.Meta(ge=1)] = 64


class Demand(msgspec.Struct, kw_only=True, frozen=True):
    """What one admitted session takes from its host until the host's heartbeat shows it."""

    busy_fraction: float
    state_bytes: int


class Estimate(msgspec.Struct, kw_only=True, frozen=True):
    """The arithmetic behind one verdict for one host, returned with the verdict."""

    host_id: str
    fits: bool
    reason: str  # "" when it fits; else no_profile | period | busy | memory | slots
    tier: int = 0
    quantum_ms: float = 0.0
    block_ms: float = 0.0  # every stage of one block at `tier` with the candidate added (`block_ms_at`)
    device_sessions: int = 0  # sessions on the device before the candidate (every host's, reservations too)
    busy_fraction: float = 0.0  # the candidate's steady-state share of the device
    state_bytes: int = 0
    host_busy_fraction: float = 0.0  # measured load plus pending placements, before the candidate
    busy_limit: float = 0.0  # 1 - guard
    host_free_bytes: int = 0  # measured free memory less pending placements, before the candidate
    memory_guard_bytes: int = 0
    host_sessions: int = 0  # measured sessions plus pending placements, before the candidate
    max_sessions: int = 0


def floor_row(rows: Sequence[ProfileRow], backend: str, floor: int) -> ProfileRow | None:
    """The cheapest measured row that meets the floor: the lowest profiled tier >= floor."""
    fitting = [r for r in rows if r.backend == backend and r.tier >= floor]
    return min(fitting, key=lambda r: r.tier) if fitting else None


def block_ms_at(row: ProfileRow, k: int) -> float:
    """One block's device time while `k` sessions share the device: the row's co-location curve
    (`ProfileRow.colocated[i]` is at 2**i sessions), linear between measured points, linear from the
    last two beyond the last (never falling below the last: a device is not taken to get cheaper per
    block than it was measured at); a row without a curve costs its lone `block_ms` at any k."""
    curve = row.colocated
    if not curve:
        return row.block_ms
    if k <= 1:
        return curve[0]
    i = min(k.bit_length() - 1, len(curve) - 1)  # the last measured point at or below k
    lo = 1 << i
    if i + 1 < len(curve):
        return curve[i] + (curve[i + 1] - curve[i]) * (k - lo) / lo
    if i == 0:
        return curve[0]
    slope = (curve[i] - curve[i - 1]) / (lo - lo // 2)
    return curve[i] + max(slope, 0.0) * (k - lo)


def device_ms(row: ProfileRow, k: int) -> float:
    """Device time one block of each of `k` sessions of this kind takes together: k × block_ms(k)."""
    return k * block_ms_at(row, k) if k > 0 else 0.0


def demand(contract: Contract, row: ProfileRow, k: int = 0) -> Demand:
    """What a session of `contract` adds to a device that `k` sessions share already: its window's blocks
    at the marginal device time of going from k to k + 1 sessions (the others' blocks slow too), so the
    shares of sessions admitted one by one sum to what k sessions were measured to take. With no
    curve, each block at its lone cost, whatever k."""
    window = contract.window_ms
    marginal = max(device_ms(row, k + 1) - device_ms(row, k), 0.0)
    share = 0.0 if window is None else contract.blocks_per_window * marginal / window
    return Demand(busy_fraction=share, state_bytes=row.state_bytes)


def estimate(contract: Contract, backend: str, host: EngineEntry, pending: Sequence[Demand],
             guard: Guard) -> Estimate:
    """Does `contract` fit `host` now, given placements its heartbeat does not show yet?"""
    row = floor_row(host.profile, backend, contract.quality_floor)
    if row is None:
        return Estimate(host_id=host.host_id, fits=False, reason="no_profile")
    sessions = host.sessions + len(pending)
    on_device = sessions + host.peer_sessions
    need = demand(contract, row, on_device)
    busy = host.busy_fraction + sum(p.busy_fraction for p in pending)
    free = host.free_memory_bytes - sum(p.state_bytes for p in pending)
    mem_guard = int(guard.memory_fraction * host.memory_bytes)
    reason = _first_failure(demand(contract, row).busy_fraction, need, busy, free, mem_guard, sessions, guard)
    return Estimate(host_id=host.host_id, fits=not reason, reason=reason, tier=row.tier,
                    quantum_ms=row.quantum_ms, block_ms=block_ms_at(row, on_device + 1),
                    device_sessions=on_device, busy_fraction=need.busy_fraction,
                    state_bytes=need.state_bytes, host_busy_fraction=busy,
                    busy_limit=1.0 - guard.busy_fraction, host_free_bytes=free,
                    memory_guard_bytes=mem_guard, host_sessions=sessions, max_sessions=guard.max_sessions)


def _first_failure(alone: float, need: Demand, busy: float, free: int, mem_guard: int, sessions: int,
                   guard: Guard) -> str:
    if alone > 1.0 + _EPS:
        return "period"  # one session alone needs more than the whole device
    if busy + need.busy_fraction > 1.0 - guard.busy_fraction + _EPS:
        return "busy"
    if free - need.state_bytes < mem_guard:
        return "memory"
    if sessions + 1 > guard.max_sessions:
        return "slots"
    return ""


def measured_view(host: EngineEntry) -> EngineEntry:
    """`host` as admission reads it: the dearer of its priced load and the load it measured itself carrying
    (priced leads: a session just placed counts at once; measured lags but sees what prices miss: costs that
    rose, a neighbour), so it never adds to a device overload relief would shed from; plus the share its
    re-queued `capacity_lost` sessions hold, so no newcomer takes the room they wait to come back to."""
    load = max(host.busy_fraction, host.measured_fraction) + host.held_fraction
    return host if load == host.busy_fraction else msgspec.structs.replace(host, busy_fraction=load)


def device_key(host: EngineEntry) -> str:
    """Hosts with equal keys share one device: the same machine (`EngineEntry.machine`, announced in
    every heartbeat) and the same device ("cpu" is the machine's CPU; "cuda:0" one of its GPUs)."""
    return f"{host.machine}/{host.device}" if host.machine else f"host:{host.host_id}"


def pooled(hosts: Sequence[EngineEntry],
           pending: Callable[[EngineEntry], Sequence[Demand]]) -> dict[str, EngineEntry]:
    """Each host as capacity must see it when hosts share a device: they split it, so every one of them
    carries the whole device's load (its peers' measured load and unsettled reservations), the memory
    its peers' reservations will take, and their sessions (`peer_sessions`: the k a candidate's
    co-location cost is read at). Each host counts its own reservations as usual (pass `pending(host)`
    to `estimate`); a host alone on its device is returned unchanged."""
    groups: dict[str, list[EngineEntry]] = {}
    for h in hosts:
        groups.setdefault(device_key(h), []).append(h)
    out = {}
    for peers in groups.values():
        if len(peers) == 1:
            out[peers[0].host_id] = peers[0]
            continue
        held = {p.host_id: pending(p) for p in peers}
        for h in peers:
            out[h.host_id] = device_view(h, peers, held)
    return out


def device_view(h: EngineEntry, peers: Sequence[EngineEntry], held: Mapping[str, Sequence[Demand]], *,
                fold_own: bool = False) -> EngineEntry:
    """`h` carrying its device's load (`pooled`). `fold_own`: its own reservations folded in too (none
    then to pass to `estimate`), summed over every peer in one order, so each host of the device reads
    the same load to the last bit (placement's ties between them are then ties, not rounding)."""
    others = [p for p in peers if p.host_id != h.host_id]
    peer_sessions = sum(p.sessions + len(held[p.host_id]) for p in others)
    rows = device_rows(h, peers)
    if fold_own:
        busy = sum(p.busy_fraction + sum(d.busy_fraction for d in held[p.host_id]) for p in peers)
        taken = sum(d.state_bytes for p in peers for d in held[p.host_id])
        return msgspec.structs.replace(h, busy_fraction=busy, free_memory_bytes=h.free_memory_bytes - taken,
                                       sessions=h.sessions + len(held[h.host_id]), peer_sessions=peer_sessions,
                                       profile=rows)
    busy = h.busy_fraction + sum(p.busy_fraction + sum(d.busy_fraction for d in held[p.host_id]) for p in others)
    taken = sum(d.state_bytes for p in others for d in held[p.host_id])
    return msgspec.structs.replace(h, busy_fraction=busy, free_memory_bytes=h.free_memory_bytes - taken,
                                   peer_sessions=peer_sessions, profile=rows)


def device_rows(h: EngineEntry, peers: Sequence[EngineEntry]) -> list[ProfileRow]:
    """`h`'s rows at its device's cost: each at the dearest block any host of the device has learned for
    that backend and tier (its heartbeat's refreshed row). One device has one cost: a host serving
    nothing still carries start-up's, a host serving the device's sessions what they cost now, and
    reading the cheap one priced the idle process's next session below what the device then ran (and
    split the device's sessions over its processes, which costs it more: docs/bench-colocation.md).
    Only `h`'s own rows, and only their costs: a backend only a peer serves is not offered by `h`."""
    dearest: dict[tuple[str, int], ProfileRow] = {}
    for p in peers:
        for r in p.profile:
            key = (r.backend, r.tier)
            if key not in dearest or r.block_ms > dearest[key].block_ms:
                dearest[key] = r
    out = []
    for r in h.profile:
        d = dearest[(r.backend, r.tier)]
        out.append(r if d.block_ms <= r.block_ms else  # the costs only: sizes are the host's own config's
                   msgspec.structs.replace(r, block_ms=d.block_ms, quantum_ms=d.quantum_ms, colocated=d.colocated))
    return out


def carried(contract: Contract, backend: str, hosts: Sequence[EngineEntry], guard: Guard) -> dict[str, int]:
    """How many more sessions of `contract` each device takes (by `device_key`), placed one at a time
    where `estimate` fits them on the hosts as they are now: hosts sharing a device see its pooled load,
    so a device's capacity is counted once however many hosts serve it."""
    held: dict[str, list[Demand]] = {h.host_id: [] for h in hosts}
    count = {device_key(h): 0 for h in hosts}
    while True:
        views = pooled(hosts, lambda h: held[h.host_id])
        fit = next((e for h in sorted(hosts, key=lambda h: h.host_id)
                    if (e := estimate(contract, backend, views[h.host_id], held[h.host_id], guard)).fits), None)
        if fit is None or contract.window_ms is None:  # nothing fits, or windowless: slots, not device time
            return count
        held[fit.host_id].append(Demand(busy_fraction=fit.busy_fraction, state_bytes=fit.state_bytes))
        count[device_key(views[fit.host_id])] += 1


def idle(host: EngineEntry) -> EngineEntry:
    """The host as it would be with nothing on it: to tell "not now" from "never"."""
    return msgspec.structs.replace(host, busy_fraction=0.0, free_memory_bytes=host.memory_bytes,
                                   sessions=0, peer_sessions=0, state_bytes_resident=0)


def backend_tiers(hosts: Iterable[EngineEntry], backend: str) -> set[int]:
    return {r.tier for h in hosts for r in h.profile if r.backend == backend}


def unsettled(session_id: str, at: float, host: EngineEntry, settle_s: float) -> bool:
    """Whether a placement of `session_id` on `host` at `at` still counts against it: until the host's
    heartbeat lists the session (from then on its measured load does), or, for one that never arrives
    there, until a heartbeat `settle_s` newer than the placement. Releasing a reservation when some time
    had passed let admission place past the device: under load a session can take longer than any
    fixed settle time to be assigned, built and counted (docs/decisions.md, issue 23)."""
    return session_id not in host.session_ids and host.heartbeat_at < at + settle_s


class Reservations:
    """Placements a host's heartbeat does not show yet, so two quick admissions never share one gap.

    A reservation on a host counts until `unsettled` says the host's heartbeat shows the session, or
    that it never arrived. Host and placer clocks are compared, so `settle_s` must also cover their skew.
    """

    def __init__(self, settle_s: float) -> None:
        self.settle_s = settle_s
        self._hosts: dict[str, dict[str, tuple[Demand, float]]] = {}
        self._where: dict[str, str] = {}

    def add(self, session_id: str, host_id: str, need: Demand, at: float) -> None:
        self.drop(session_id)
        self._where[session_id] = host_id
        self._hosts.setdefault(host_id, {})[session_id] = (need, at)

    def drop(self, session_id: str) -> bool:
        host_id = self._where.pop(session_id, None)
        if host_id is None:
            return False
        del self._hosts[host_id][session_id]
        return True

    def host_of(self, session_id: str) -> str | None:
        return self._where.get(session_id)

    def on(self, host: EngineEntry) -> list[Demand]:
        """The reservations still counted against `host`; ones its heartbeat has caught up with go."""
        held = self._hosts.get(host.host_id, {})
        for sid in [sid for sid, (_, at) in held.items() if not unsettled(sid, at, host, self.settle_s)]:
            self.drop(sid)
        return [need for need, _ in held.values()]
