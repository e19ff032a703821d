"""The host's backends (one per name and config) and what a quantum of each costs on this device."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

import crc32c
import torch

from libs.contracts import MEASURE_WINDOW_S
from services.engine_host.backends import Backend, Registry, make_backend
from services.engine_host.backends.base import forward_passes

COST_EWMA = 0.2
# A learned price this much older than its shape's freshest is derived from that one (CostModel's doc).
# Short next to the gaps between failovers: a session's floor tier runs mostly while it is stepped down
# or replayed on a loaded host, so its own samples are the slow ones. With 10 s, every kill of
# `bench.failover --hog 2` (one each ~10 s) replayed floor blocks that then set the floor's price until
# the next: the device was priced at a median 1.21 while it measured 0.27, and survivors read busy
# (2026-12-04 19:46, reclaim p99 54 s). Past a second the freshest tier, carried by start-up's ratio
# between the tiers, says better how fast the device runs now.
STALE_S = 1.0
# A learned price with no sample for IDLE_S relaxes toward the start-up measurement with half-life
# HALF_LIFE_S (CostModel's doc, docs/decisions.md "An idle host's learned price relaxes"). IDLE_S is
# longer than the gap between a served session's quanta (a C1 period is at most a few hundred ms), so a
# price that serving keeps measuring is exactly its EWMA; once nothing ran for it, what the device ran
# at seconds ago says less and less about now, and a host that stays slow relearns it from its first quanta.
IDLE_S = 1.0
HALF_LIFE_S = 2.0


def shape_of(backend: Backend) -> str:
    """Quanta of equal shape (backend and its config) can share a batched forward."""
    return f"{backend.name}:{crc32c.crc32c(backend.config_bytes()):08x}"


class Backends:
    """Builds each (name, config) backend once, from the registry; a name alone means the host's
    configured default. The one instance (its weights, shared modules) serves every session of
    that config on this host."""

    def __init__(self, device: torch.device, configs: dict[str, bytes], registry: Registry,
                 on_build: Callable[[Backend], None] = lambda b: None) -> None:
        self.device = device
        self.configs = configs
        self.registry = registry
        self.on_build = on_build
        self._built: dict[tuple[str, bytes], Backend] = {}
        self._lock = threading.Lock()  # built from the loop and from worker threads (profile, restore)

    def get(self, name: str, config: bytes | None = None) -> Backend:
        cfg = self.configs.get(name, b"") if config is None else config
        key = (name, cfg)
        with self._lock:
            if key not in self._built:
                self._built[key] = backend = make_backend(self.registry, name, cfg, self.device)
                self.on_build(backend)
            return self._built[key]


class CostModel:
    """Seconds per quantum by (shape, tier, batch size): seeded from the start-up profile, then
    learned from every quantum that finished (an EWMA, so it follows a device that slows down).

    A learned price is only as current as its last measurement, and a tier no session runs is never
    measured: a session is served at its best tier that fits, so its floor (what `busy_fraction`
    budgets it at) can go unmeasured for as long as it lives. One slow floor quantum (a replay on a
    loaded machine) then stayed the floor's price: a host promised 0.77 of the device while it ran
    0.05, and every host sharing that CPU read busy, so no failover found room (issue 29). So a price
    learned more than `stale_s` before the shape's freshest single-block price (or only seeded, once
    serving measured any tier) is derived from that freshest one: its tier's start-up price times
    how much slower than at start-up the freshest tier runs now (forward passes scale it where
    start-up measured no price).

    And a learned price is evidence of what the device ran at when it was learned, which fades: with no
    sample for `idle_s`, it relaxes toward the start-up price, exponentially with half-life `half_life_s`
    (`start-up + (learned − start-up) · 2^(−(age − idle_s) / half_life_s)`). Without that, a host that learned a
    high price while a neighbour loaded the machine and then went idle kept that price forever (no
    quantum ran to correct it): every survivor of a failover refused the stranded sessions as `period`
    (one block alone longer than the period), and only a freshly restarted host took them (issue 29).
    With no start-up price to relax toward, a price stays what was learned.

    A single block's price is also priced at a concurrency (`price`): each learned price keeps the
    number of sessions its host served when it was learned, and the start-up co-location curve carries it
    to another number by its slope (`curve(k) / curve(k_learned)`), so serving sets how fast the device
    runs now and the curve only how co-location slows it. The start-up measurement is not a floor: a
    profile taken while a neighbour loaded the machine priced every block at four times what serving
    measured, for the host's whole life, and failover's survivors read full while the device ran a
    sixth of its time (`bench.failover --hog 2`, 2026-12-04). A burst is priced by the curve's slope from
    what serving learned, so a quiet device's cheap lone blocks do not admit sixteen where four fit.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic, stale_s: float = STALE_S,
                 idle_s: float = IDLE_S, half_life_s: float = HALF_LIFE_S,
                 concurrency: Callable[[], int] = lambda: 1) -> None:
        self.clock, self.stale_s, self.idle_s, self.half_life_s = clock, stale_s, idle_s, half_life_s
        self.concurrency = concurrency  # sessions the host serves now: what a learned price was learned beside
        self._learned: dict[tuple[str, int, int], tuple[float, float, int]] = {}  # → (seconds, when, sessions)
        self._seeds: dict[tuple[str, int], float] = {}  # (shape, tier) → start-up seconds of one block
        self._curves: dict[tuple[str, int], Callable[[int], float]] = {}  # → start-up block at k sessions
        self._passes: dict[str, Callable[[int], int]] = {}
        self._fresh: dict[str, int] = {}  # shape → the tier of its last learned single block
        self.learned_beside = 0  # sessions the host served when the last quantum (any shape) was learned
        # shape → (finished at, tier, stage seconds, blocks, sessions served) of the quanta of the last window
        self._served: dict[str, deque[tuple[float, int, float, int, int]]] = {}

    def shape(self, backend: Backend) -> None:
        """Know a shape's forward passes per tier, so a tier not measured yet is priced from one that was."""
        self._passes[shape_of(backend)] = lambda tier: forward_passes(backend, tier)

    def estimate(self, shape: str, tier: int, n: int) -> float:
        """Learned for this batch size and current, else n × the single block (learned and current, else
        derived from the freshest tier, else its start-up price, else another start-up tier's scaled by
        forward passes); 0 before anything is known."""
        if (c := self._current(shape, tier, n)) is not None:
            return c
        return self._single(shape, tier) * n

    def seed(self, shape: str, tier: int, seconds: float, curve: Callable[[int], float] | None = None) -> None:
        """A single block's start-up estimate, and its co-location curve (any unit: only its slope is
        read); never overrides what was already learned."""
        self._seeds.setdefault((shape, tier), seconds)
        if curve is not None:
            self._curves.setdefault((shape, tier), curve)

    def price(self, shape: str, tier: int, k: int) -> float:
        """What one session's block is budgeted at beside `k` sessions on this host (admission's price,
        the heartbeat's load): the device time a block took while serving (`served`), else the single block
        as learned (else derived, else start-up's), carried from the concurrency it was measured at to `k`
        by the start-up curve's slope."""
        seconds, at_k = self.served(shape, tier) or self._single_at(shape, tier)
        return seconds * self._slope(shape, tier, at_k, k)

    def served(self, shape: str, tier: int) -> tuple[float, int] | None:
        """(seconds, sessions): the device time a block of `tier` took over the last measurement window, all
        its quanta's stage time over all their blocks, batched or not, and the sessions served meanwhile
        (block-weighted); a tier not served in the window from the shape's most served tier by start-up's
        ratio between them. None when nothing of the shape finished within the window.

        This is the same quantity over the same window as the host's measured load (`DeviceTime`), so what
        the heartbeat prices its sessions at is what they measured. A per-quantum EWMA was not: a busy host
        runs its blocks mostly batched, each quantum a sample of very different size, and its single-block
        price swung 0.3-2.0 of the device at one heartbeat to the next with sixteen sessions while they
        measured 0.7-0.9 (`bench.c1_periods`, 2026-12-07), or, learned from lone quanta only, relaxed toward
        start-up's while the host served batches and priced them at a third of what they measured."""
        done = self._served.get(shape)
        if not done:
            return None
        while done and done[0][0] < self.clock() - MEASURE_WINDOW_S:
            done.popleft()
        per: dict[int, list[float]] = {}  # tier → [stage seconds, blocks, sessions × blocks]
        for _, t, seconds, n, k in done:
            acc = per.setdefault(t, [0.0, 0, 0])
            acc[0] += seconds
            acc[1] += n
            acc[2] += k * n
        if not per:
            return None
        ref = tier if tier in per else max(per, key=lambda t: per[t][1])
        r = 1.0 if ref == tier else self._ratio(shape, tier, ref)
        if r is None:
            return None
        seconds, blocks, weighted = per[ref]
        return seconds / blocks * r, max(1, round(weighted / blocks))

    def learn(self, shape: str, tier: int, n: int, seconds: float) -> None:
        """Fold one finished quantum of `n` blocks in: its batch size's price (the scheduler's), and the
        device time its blocks took for what a block is priced at (`price`)."""
        self._fold(shape, tier, n, seconds)
        served = self._served.setdefault(shape, deque())
        served.append((self.clock(), tier, seconds, n, max(1, self.concurrency())))

    def _fold(self, shape: str, tier: int, n: int, seconds: float) -> None:
        """A price that was not current starts from what it was derived as, carried to the concurrency the
        host serves now."""
        k = max(1, self.concurrency())
        old = self._current(shape, tier, n)
        if old is not None:
            old *= self._slope(shape, tier, self._learned[(shape, tier, n)][2], k)
        elif n == 1:
            single, at_k = self._single_at(shape, tier)
            old = single * self._slope(shape, tier, at_k, k) or None
        new = seconds if old is None else (1 - COST_EWMA) * old + COST_EWMA * seconds
        self._learned[(shape, tier, n)] = (new, self.clock(), k)
        self.learned_beside = k
        if n == 1:
            self._fresh[shape] = tier

    def _slope(self, shape: str, tier: int, k_from: int, k_to: int) -> float:
        """How much dearer a block is beside `k_to` sessions than beside `k_from`, by the start-up curve
        (1 without one)."""
        curve = self._curves.get((shape, tier))
        if curve is None or k_from == k_to:
            return 1.0
        a, b = curve(max(1, k_from)), curve(max(1, k_to))
        return b / a if a > 0 and b > 0 else 1.0

    def _freshest(self, shape: str) -> tuple[int, float, float, int] | None:
        """(tier, seconds, when, sessions) of the shape's most recently learned single-block price."""
        tier = self._fresh.get(shape)
        if tier is None:
            return None
        _, at, k = self._learned[(shape, tier, 1)]
        return tier, self._relaxed(shape, tier, 1), at, k

    def _relaxed(self, shape: str, tier: int, n: int) -> float:
        """The learned price, relaxed toward n × the start-up price (at the concurrency it was learned
        at) by how long nothing was learned for it."""
        seconds, at, k = self._learned[(shape, tier, n)]
        # Idle once no quantum ran for IDLE_S and for twice the quantum itself: a slow quantum's next sample
        # comes a quantum later, so a host still serving one never relaxes its price between them.
        idle = self.clock() - at - max(self.idle_s, 2 * seconds)
        base = self._start_up(shape, tier) * n * self._slope(shape, tier, 1, k)
        if idle <= 0 or base <= 0:
            return seconds
        return base + (seconds - base) * 0.5 ** (idle / self.half_life_s)

    def _current(self, shape: str, tier: int, n: int) -> float | None:
        learned = self._learned.get((shape, tier, n))
        if learned is None:
            return None
        ref = self._freshest(shape)
        return self._relaxed(shape, tier, n) if ref is None or ref[2] - learned[1] <= self.stale_s else None

    def _single(self, shape: str, tier: int) -> float:
        return self._single_at(shape, tier)[0]

    def _single_at(self, shape: str, tier: int) -> tuple[float, int]:
        """A single block's seconds and the sessions it was learned beside (start-up's: one)."""
        if (c := self._current(shape, tier, 1)) is not None:
            return c, self._learned[(shape, tier, 1)][2]
        ref = self._freshest(shape)
        if ref is not None and (r := self._ratio(shape, tier, ref[0])) is not None:
            return ref[1] * r, ref[3]
        if (shape, tier, 1) in self._learned:
            return self._relaxed(shape, tier, 1), self._learned[(shape, tier, 1)][2]  # stale, nothing to derive from
        return self._start_up(shape, tier), 1

    def _start_up(self, shape: str, tier: int) -> float:
        """A single block's start-up price: measured, else another start-up tier's scaled by forward
        passes; 0 when start-up measured none."""
        if (c := self._seeds.get((shape, tier))) is not None:
            return c
        seeded = [t for (sh, t) in self._seeds if sh == shape]
        r = self._ratio(shape, tier, max(seeded)) if seeded else None
        return self._seeds[(shape, max(seeded))] * r if r is not None else 0.0

    def _ratio(self, shape: str, tier: int, t0: int) -> float | None:
        """What a block at `tier` costs relative to one at `t0`: as start-up measured the two, else by
        forward passes (a clean pass costs as much as a step); None when neither is known."""
        a, b = self._seeds.get((shape, tier)), self._seeds.get((shape, t0))
        if a and b:
            return a / b
        passes = self._passes.get(shape)
        return passes(tier) / passes(t0) if passes is not None else None
