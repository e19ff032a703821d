"""The quanta scheduler: a pure, synchronous EDF core over generation quanta (one block each).

Time is whatever clock the caller passes in (seconds), so tests drive it with a
fake clock. Classes:

- C1 interactive: releases on a fixed grid `t0 + k·period`, hard deadline at the next
  release. Queue depth 1: a release still waiting when the next one comes is skipped,
  and so is one that can no longer finish by its deadline even at the lowest tier,
  so lateness never cascades (but never more than `probe_after` in a row: that test rests on a
  learned cost only a running block corrects).
- C2a planner, C2b rollout: the same grid, soft deadlines (run late rather than skip,
  still depth 1).
- C3 bulk, C4 replay, C5 maintenance: no deadline; they run the blocks they are asked
  for, in that class order, only in residual time.

Sessions yield only at block boundaries (a dispatched quantum is never preempted), so
before starting any quantum that is not the most urgent C1 the core checks a guard
band: the quantum must end, plus `guard_s`, before every C1 release's latest start
time. A periodic session steps down its quality ladder when its quantum would miss
at the current tier, and back up after `up_after` blocks that finished with room
for the next tier. The host as a whole steps down too: whenever the periodic sessions'
steady-state load at their current tiers (`load()`, from the learned costs) passes
`busy_limit`, the session with the highest tier steps down a rung, until the load fits,
so a host under pressure gives up quality before it misses a period; a step up that would
push the load past the limit waits. Pressure the costs do not show (C1 periods going by
unserved) lowers the working limit for a while, so the ladder steps down then too. Ready quanta of the same shape (backend, tier) from sessions that
allow it are coalesced into one batched dispatch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from libs.contracts import Guard
from libs.session_classes import BULK_ORDER, PERIODIC

CLASS_RANK = {c: i for i, c in enumerate(PERIODIC + BULK_ORDER)}

# cost(shape, tier, batch) -> estimated seconds of one quantum
CostFn = Callable[[str, int, int], float]


@dataclass
class Task:
    sid: str
    cls: str
    shape: str  # quanta of equal shape (backend and its config) can share a batched forward
    ladder: tuple[int, ...]  # allowed tiers, ascending (already cut at the quality floor)
    tier: int
    period_s: float = 0.0
    next_release: float = math.inf
    pending_release: float | None = None  # depth-1 queue of periodic releases
    budget: int = 0  # blocks asked for (non-periodic classes)
    batchable: bool = False
    running: bool = False
    paused: bool = False
    last_start: float = -math.inf  # bulk sessions of one class take turns by this
    slack_blocks: int = 0
    hopeless_run: int = 0  # C1 releases skipped as hopeless in a row since its last dispatch
    # counters
    skipped: int = 0
    missed: int = 0
    tier_changes: int = 0
    pressure_steps: int = 0  # step-downs the host's load forced (of tier_changes)

    @property
    def deadline(self) -> float:
        return self.pending_release + self.period_s if self.pending_release is not None else math.inf


@dataclass(frozen=True)
class Dispatch:
    sids: tuple[str, ...]
    tier: int
    start: float
    deadlines: tuple[float, ...]


@dataclass(frozen=True)
class Idle:
    until: float  # nothing can start before this time (inf: until something changes)
    reason: str


@dataclass
class EdfScheduler:
    cost: CostFn
    guard_s: float = 0.002
    max_batch: int = 8
    up_after: int = 8
    # the device share periodic sessions may take at their current tiers: admission's budget (1 − guard)
    busy_limit: float = 1.0 - Guard().busy_fraction
    # What the costs do not show (the event loop, other processes on the cores) shows as C1 releases
    # skipped or blocks late: each such period cuts the working limit by `cut` (at most once per
    # `cut_every_s`, never below `min_limit`), and every `raise_every_s` without one gives back `give`.
    cut: float = 0.9
    cut_every_s: float = 0.5
    raise_every_s: float = 2.0
    give: float = 0.05
    min_limit: float = 0.2
    # A C1 release is skipped as hopeless on the learned cost, and only a block that runs corrects that
    # cost: one slow block (a stall of the machine) could price the floor above the period for good and
    # starve the session, its acknowledged input never applied. After this many hopeless skips in a row
    # the next release runs at the floor anyway, so a C1 session runs at least one block in every
    # `probe_after + 1` releases and an accepted item waits at most that many periods for its block.
    probe_after: int = 3
    limit: float = math.nan  # the working limit (starts at busy_limit)
    _last_cut: float = -math.inf
    _last_raise: float = -math.inf
    _trouble: bool = False  # a C1 period went by unserved since the last pick
    tasks: dict[str, Task] = field(default_factory=dict)
    dispatched: list[Dispatch] = field(default_factory=list, repr=False)
    record: bool = False  # keep every dispatch (tests)

    # ------------------------------------------------------------ membership

    def add(self, task: Task, now: float) -> None:
        if task.cls in PERIODIC:
            if task.period_s <= 0:
                raise ValueError(f"{task.cls} needs a positive period")
            task.next_release = now
        self.tasks[task.sid] = task

    def remove(self, sid: str) -> None:
        self.tasks.pop(sid, None)

    def ask(self, sid: str, blocks: int) -> None:
        self.tasks[sid].budget += blocks

    def pause(self, sid: str, paused: bool, now: float) -> None:
        t = self.tasks[sid]
        t.paused = paused
        t.pending_release = None
        if not paused and t.cls in PERIODIC:
            t.next_release = now  # a resumed session restarts its grid rather than owing missed releases

    # ------------------------------------------------------------ releases

    def _release(self, now: float) -> None:
        for t in self.tasks.values():
            if t.paused or t.cls not in PERIODIC:
                continue
            while t.next_release <= now:
                if t.pending_release is not None:
                    t.skipped += 1  # depth 1: the older release never ran and is superseded
                    self._trouble |= t.cls == "C1"
                t.pending_release = t.next_release
                t.next_release += t.period_s

    def _ready(self, t: Task) -> bool:
        if t.running or t.paused:
            return False
        return t.pending_release is not None if t.cls in PERIODIC else t.budget > 0

    # ------------------------------------------------------------ the decision

    def pick(self, now: float) -> Dispatch | Idle:
        self._release(now)
        self._skip_hopeless(now)
        self._adapt(now)
        self._relieve()
        ready = [t for t in self.tasks.values() if self._ready(t)]
        periodic = sorted((t for t in ready if t.cls in PERIODIC),
                          key=lambda t: (t.deadline, CLASS_RANK[t.cls], t.sid))
        bulk = sorted((t for t in ready if t.cls not in PERIODIC), key=lambda t: (CLASS_RANK[t.cls], t.last_start, t.sid))
        for t in periodic + bulk:
            tier = self._tier_for(t, now)
            group = self._coalesce(t, tier, ready, now)
            cost = self.cost(t.shape, tier, len(group))
            if t.cls == "C1" or self._guard_ok(now + cost, exclude=group):
                return self._dispatch(group, tier, now)
        return self._idle(now, bool(ready))

    def load(self) -> float:
        """Device share the periodic sessions take at their current tiers (steady state, learned costs)."""
        return sum(self._share(t, t.tier) for t in self.tasks.values() if t.cls in PERIODIC and not t.paused)

    def _share(self, t: Task, tier: int) -> float:
        return self.cost(t.shape, tier, 1) / t.period_s

    def _adapt(self, now: float) -> None:
        if math.isnan(self.limit):
            self.limit = self.busy_limit
        if self._trouble and now - self._last_cut >= self.cut_every_s:
            self.limit = max(self.min_limit, self.limit * self.cut)
            self._last_cut = self._last_raise = now
        elif not self._trouble and now - max(self._last_cut, self._last_raise) >= self.raise_every_s:
            self.limit = min(self.busy_limit, self.limit + self.give)
            self._last_raise = now
        self._trouble = False

    def _relieve(self) -> None:
        """Under pressure, step the highest-tier periodic sessions down a rung each until the load fits."""
        live = [t for t in self.tasks.values() if t.cls in PERIODIC and not t.paused]
        load = sum(self._share(t, t.tier) for t in live)
        while load > self.limit + 1e-12:
            can = [t for t in live if t.tier > t.ladder[0]]
            if not can:
                return  # every session is at its floor: admission's promise, nothing left to give
            t = max(can, key=lambda x: (x.tier, self._share(x, x.tier) - self._share(x, _below(x)), x.sid))
            lower = _below(t)
            load -= self._share(t, t.tier) - self._share(t, lower)
            t.tier, t.slack_blocks = lower, 0
            t.tier_changes += 1
            t.pressure_steps += 1

    def _skip_hopeless(self, now: float) -> None:
        """C1 releases that cannot finish by their deadline even at the lowest tier are skipped now."""
        for t in self.tasks.values():
            if t.cls == "C1" and self._ready(t) and now + self.cost(t.shape, t.ladder[0], 1) > t.deadline:
                if t.hopeless_run >= self.probe_after:
                    continue  # the estimate may be stale: this release runs and re-measures it
                t.hopeless_run += 1
                t.skipped += 1
                t.pending_release = None
                self._trouble = True

    def _tier_for(self, t: Task, now: float) -> int:
        """The highest tier at or below the current one that still meets the deadline (periodic classes)."""
        if t.cls not in PERIODIC:
            return t.tier
        fits = [x for x in t.ladder if x <= t.tier and now + self.cost(t.shape, x, 1) <= t.deadline - self.guard_s]
        chosen = fits[-1] if fits else t.ladder[0]
        if chosen != t.tier:
            t.tier, t.slack_blocks = chosen, 0
            t.tier_changes += 1
        return chosen

    def _coalesce(self, lead: Task, tier: int, ready: list[Task], now: float) -> list[Task]:
        if not lead.batchable or self.max_batch <= 1:
            return [lead]
        group = [lead]
        for t in ready:
            if len(group) >= self.max_batch:
                break
            if t is lead or not t.batchable or t.shape != lead.shape or t.tier != tier:
                continue
            end = now + self.cost(lead.shape, tier, len(group) + 1)
            if all(end <= g.deadline - self.guard_s for g in group + [t]):
                group.append(t)
        return group

    def _guard_ok(self, end: float, exclude: list[Task]) -> bool:
        """Starting a quantum that ends at `end` leaves every C1 release (pending or next) able to run
        at its current tier, in EDF order after it, and finish `guard_s` before its deadline."""
        skip = {t.sid for t in exclude}
        jobs = []
        for t in self.tasks.values():
            if t.cls != "C1" or t.paused or t.sid in skip:
                continue
            c1_cost = self.cost(t.shape, t.tier, 1)  # protect its current quality, not just its floor
            if t.pending_release is not None and not t.running:
                jobs.append((t.deadline, t.pending_release, c1_cost))
            jobs.append((t.next_release + t.period_s, t.next_release, c1_cost))
        cursor = end
        for deadline, release, c1_cost in sorted(jobs):
            cursor = max(cursor, release) + c1_cost
            if cursor + self.guard_s > deadline:
                return False
        return True

    def _dispatch(self, group: list[Task], tier: int, now: float) -> Dispatch:
        d = Dispatch(sids=tuple(t.sid for t in group), tier=tier, start=now,
                     deadlines=tuple(t.deadline for t in group))
        for t in group:
            t.running = True
            t.hopeless_run = 0
            t.last_start = now
            t.tier = tier if t.cls in PERIODIC else t.tier
            if t.cls in PERIODIC:
                t.pending_release = None
            else:
                t.budget -= 1
        if self.record:
            self.dispatched.append(d)
        return d

    def _idle(self, now: float, blocked: bool) -> Idle:
        if blocked:
            return Idle(until=now + self.guard_s, reason="guard_band")
        nxt = min((t.next_release for t in self.tasks.values() if t.cls in PERIODIC and not t.paused),
                  default=math.inf)
        return Idle(until=nxt, reason="waiting_release" if nxt < math.inf else "no_work")

    # ------------------------------------------------------------ completion

    def done(self, d: Dispatch, now: float) -> None:
        for sid, deadline in zip(d.sids, d.deadlines, strict=True):
            t = self.tasks.get(sid)
            if t is None:
                continue  # removed while running
            t.running = False
            if now > deadline:
                t.missed += 1
                self._trouble |= t.cls == "C1"
            if t.cls in PERIODIC:
                self._maybe_step_up(t, deadline - now)

    def _maybe_step_up(self, t: Task, slack: float) -> None:
        higher = [x for x in t.ladder if x > t.tier]
        if not higher:
            return
        extra = self.cost(t.shape, higher[0], 1) - self.cost(t.shape, t.tier, 1)
        t.slack_blocks = t.slack_blocks + 1 if slack > extra + self.guard_s else 0
        limit = self.busy_limit if math.isnan(self.limit) else self.limit
        if t.slack_blocks >= self.up_after and self.load() + extra / t.period_s <= limit + 1e-12:
            t.tier, t.slack_blocks = higher[0], 0
            t.tier_changes += 1


def _below(t: Task) -> int:
    return max(x for x in t.ladder if x < t.tier)
