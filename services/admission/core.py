"""The admission decision as a pure, synchronous core: no I/O, the clock passed in.

A candidate is admitted iff its steady-state quanta at its quality floor, its
resident state and the guard band fit some live engine host's residual capacity
(measured load from its heartbeat, less placements the heartbeat does not show
yet) and the host has a retained-session slot. Otherwise it waits in a bounded
FIFO until its deadline, or is rejected with a reason:

- incoherent_contract: the contract contradicts itself or the backend;
- never_fits: no live host could take it even with nothing else on it;
- queue_full: it does not fit now and the queue holds `queue_capacity` already;
- queue_timeout: it waited `queue_timeout_s` without fitting.

The queue is strict FIFO: a newcomer never overtakes a waiting candidate, so a
large session is not starved by a stream of small ones. Every verdict carries
the estimates it was decided on.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from libs.contracts import (
    Contract,
    Demand,
    Estimate,
    Guard,
    Reservations,
    backend_tiers,
    check_coherence,
    device_key,
    estimate,
    idle,
    measured_view,
    pooled,
)
from libs.errors import BadRequest
from libs.schemas.admission import AdmissionVerdict
from libs.schemas.common import EngineEntry
from services.admission.ramp import Ramp, device_measured, ramped

# A verdict that is not an admission shows this many hosts' estimates (host_id order), not the whole fleet.
MAX_REPORTED_ESTIMATES = 16


@dataclass(frozen=True, slots=True)
class Candidate:
    session_id: str
    backend: str
    contract: Contract


@dataclass(frozen=True, slots=True)
class Policy:
    guard: Guard
    queue_capacity: int
    queue_timeout_s: float
    settle_s: float  # how long a placement counts against its host without showing in its heartbeat
    ramp: Ramp = Ramp()  # how far past what it was measured serving a device is taken at once


@dataclass(frozen=True, slots=True)
class Waiting:
    candidate: Candidate
    enqueued_at: float
    deadline: float


class AdmissionCore:
    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.reservations = Reservations(policy.settle_s)
        self._queue: OrderedDict[str, Waiting] = OrderedDict()

    # ------------------------------------------------------------ decisions

    def submit(self, cand: Candidate, hosts: Sequence[EngineEntry], now: float) -> AdmissionVerdict:
        """Decide a new candidate. `admitted` is not yet recorded: follow with `placed` or `enqueue`."""
        try:
            check_coherence(cand.contract, cand.backend, backend_tiers(hosts, cand.backend))
        except BadRequest as e:
            return AdmissionVerdict(outcome="rejected", reason="incoherent_contract", detail=e.detail,
                           fields=e.fields["fields"].split(","))
        ests = []
        for e in self._estimates(cand, hosts):
            if e.fits and not self._queue:
                return AdmissionVerdict(outcome="admitted", estimates=[e])  # first fit: no need to look further
            ests.append(e)
        if not any(e.fits for e in ests) and not any(self._idle_fits(cand, h) for h in hosts):
            never = [estimate(cand.contract, cand.backend, idle(h), [], self.policy.guard)
                     for h in sorted(hosts, key=lambda h: h.host_id)[:MAX_REPORTED_ESTIMATES]]
            return AdmissionVerdict(outcome="rejected", reason="never_fits", estimates=never,
                           detail="no live engine host could take this session even when idle")
        return self.enqueue(cand, now, estimates=ests[:MAX_REPORTED_ESTIMATES])

    def enqueue(self, cand: Candidate, now: float, *, deadline: float | None = None,
                estimates: Sequence[Estimate] = ()) -> AdmissionVerdict:
        """Put `cand` at the tail (or reject it if the queue is full). `deadline` restores a waiter."""
        if cand.session_id in self._queue:
            raise BadRequest(f"session {cand.session_id} is already queued", session_id=cand.session_id)
        if len(self._queue) >= self.policy.queue_capacity:
            return AdmissionVerdict(outcome="rejected", reason="queue_full", estimates=list(estimates),
                           detail=f"no host fits now and {len(self._queue)} candidates already wait")
        deadline = now + self.policy.queue_timeout_s if deadline is None else deadline
        self._queue[cand.session_id] = Waiting(cand, now, deadline)
        return AdmissionVerdict(outcome="queued", reason="waiting_for_capacity", estimates=list(estimates),
                       queue_position=len(self._queue), queue_deadline=deadline)

    def expire(self, now: float) -> list[tuple[Candidate, AdmissionVerdict]]:
        """Remove and return every waiter whose deadline has passed."""
        gone = [w for w in self._queue.values() if w.deadline <= now]
        for w in gone:
            del self._queue[w.candidate.session_id]
        return [(w.candidate, AdmissionVerdict(outcome="timed_out", reason="queue_timeout", queue_deadline=w.deadline,
                                      detail=f"waited {now - w.enqueued_at:.3f}s without fitting any host"))
                for w in gone]

    def head_ready(self, hosts: Sequence[EngineEntry]) -> tuple[Candidate, AdmissionVerdict] | None:
        """The queue head with an `admitted` verdict if it fits now; it stays queued until `placed`."""
        if not self._queue:
            return None
        cand = next(iter(self._queue.values())).candidate
        fit = next((e for e in self._estimates(cand, hosts) if e.fits), None)
        return (cand, AdmissionVerdict(outcome="admitted", estimates=[fit])) if fit else None

    # ------------------------------------------------------------ bookkeeping

    def placed(self, session_id: str, host_id: str, need: Demand, now: float) -> None:
        """Record that placement put `session_id` on `host_id`: it leaves the queue, its demand counts."""
        self._queue.pop(session_id, None)
        self.reservations.add(session_id, host_id, need, now)

    def forget(self, session_id: str) -> bool:
        """Drop a session from the queue and from its host's reservations (it was deleted)."""
        queued = self._queue.pop(session_id, None) is not None
        return self.reservations.drop(session_id) or queued

    def ramp_hosts(self, cand: Candidate, hosts: Sequence[EngineEntry]) -> list[str] | None:
        """The hosts whose device the ramp lets take `cand` now (placement chooses among them); None for a
        candidate the ramp does not apply to (no window: it takes no device share)."""
        if cand.contract.window_ms is None:
            return None
        return [e.host_id for e in self._estimates(cand, hosts) if e.reason != "ramping"]

    def _estimates(self, cand: Candidate, hosts: Sequence[EngineEntry]) -> Iterator[Estimate]:
        """Estimates host by host in host_id order (the order placement's first fit uses), lazily; a host
        whose device would grow past its ramp does not fit now (`ramping`)."""
        hosts = [measured_view(h) for h in hosts]
        views = pooled(hosts, self.reservations.on)  # hosts that share a device split it
        measured = device_measured(hosts)
        for h in sorted(hosts, key=lambda h: h.host_id):
            e = estimate(cand.contract, cand.backend, views[h.host_id], self.reservations.on(h), self.policy.guard)
            yield ramped(e, cand.contract, measured[device_key(h)], self.policy.ramp)

    def _idle_fits(self, cand: Candidate, host: EngineEntry) -> bool:
        return estimate(cand.contract, cand.backend, idle(host), [], self.policy.guard).fits

    def position(self, session_id: str) -> int:
        """1-based place in the queue; 0 when not queued."""
        for i, sid in enumerate(self._queue, 1):
            if sid == session_id:
                return i
        return 0

    def waiting(self) -> list[Waiting]:
        return list(self._queue.values())

    def next_deadline(self) -> float | None:
        return min((w.deadline for w in self._queue.values()), default=None)
