"""A decision's working state: each host's load as the snapshot shows it plus what this decision added.

Fit verdicts come from `libs.contracts.estimate` (the one capacity model admission also uses):
whatever this decision already placed or moved onto a host counts as pending demand there, so
no two actions of one decision share one gap. A session moving away still counts on its source
until the move commits; only latency predictions credit the source at once.
"""

from __future__ import annotations

import math

from libs import admissibility
from libs.contracts import Demand, Estimate, demand, estimate, floor_row
from libs.schemas.common import ProfileRow
from services.placement.policy import latency
from services.placement.policy.params import Params
from services.placement.policy.snapshot import Fleet, Host, Session

_UNKNOWN = object()
_NONE: dict = {}  # shared and never written: `HostLoad` replaces it before its first write


class HostLoad:
    """One host's load in a decision.

    Its latency depends on its resident sessions only through their distinct terms (`kinds`,
    keyed by identity: terms come from the plan's cache) and their number `n`. The per-session
    map (`terms`, `members`) and how many sessions share each kind (`counts`) are built only for
    the hosts a step looks inside (`Plan.open_up`).
    """

    __slots__ = ("host", "host_id", "open", "pending", "residents", "terms", "members", "kinds", "counts", "n",
                 "busy", "ms", "room", "receiving", "sending", "escape", "fits")

    def __init__(self, host: Host, busy: float) -> None:
        self.host = host
        self.host_id = host.entry.host_id
        self.open = host.state == "up"  # takes new sessions: up, not draining
        self.pending: tuple[Demand, ...] = host.reserved
        self.residents: list[Session] = []  # serving or moving here in the snapshot
        # Containers are made when first needed: a decision over 10⁴ hosts allocates little (and
        # so triggers few garbage-collector passes, which are what its tail latency is made of).
        self.terms: dict[str, latency.Term] = _NONE  # once opened up: resident sessions' terms by id
        self.members: dict[str, Session] = _NONE  # the same sessions
        self.kinds: dict[int, latency.Term] = _NONE
        self.counts: dict[int, int] | None = None  # sessions per kind, once opened up
        self.n = 0
        self.busy = busy
        self.ms = 0.0
        self.room: float | None = None  # Plan.room, once asked (reset whenever the load changes)
        self.receiving = host.moves_in  # moves towards it: in flight, plus this decision's
        self.sending = 0
        self.escape = -1.0  # Plan.escape_bps, once asked
        # Plan.fit's verdicts by (backend, contract): a fit reads only the heartbeat and `pending`, so
        # it holds until `pending` grows (Plan.add resets it)
        self.fits: dict[tuple[str, int], Estimate] | None = None


class Plan:
    """One decision's working state, built in a single pass over the snapshot's sessions.

    That pass also sorts out the sessions every later step asks about (queued, suspended, idle,
    on a draining host, owning a host), so no step scans the whole fleet again. Per session it
    does only that sorting; a host's distinct terms come from its residents' distinct contracts,
    and per-session terms are worked out only for the hosts a step looks inside (the bottleneck,
    a host losing or gaining a session).
    """

    def __init__(self, fleet: Fleet, params: Params) -> None:
        self.fleet, self.params = fleet, params
        self.loads = loads = {h.host_id: HostLoad(h, h.entry.busy_fraction + sum(d.busy_fraction for d in h.reserved)
                                                  if h.reserved else h.entry.busy_fraction) for h in fleet.hosts}
        self._open = [hl for hl in loads.values() if hl.open]
        self.claimed: set[str] = set()  # sessions this decision already acts on: one action each
        self.queued: list[Session] = []
        self.suspended: list[Session] = []
        self.idle: list[Session] = []  # serving, with no input for keep_warm_s (empty when offload is off)
        self.draining: dict[str, list[Session]] = {}  # serving or suspended sessions on each draining host
        self.owned: set[str] = set()  # hosts a session is resident on, suspended in or moving from
        self._rows: dict[tuple[int, str, int], ProfileRow | None] = {}
        # Keyed by object identity: every object keyed here lives in `fleet` for the plan's lifetime.
        self._terms: dict[int, dict[tuple[str, int], latency.Term | None]] = {}
        # (profile, distinct (backend, contract) pairs) → the kinds of the hosts that have them, see `_kinds`
        self._groups: dict[tuple[int, frozenset], tuple[dict[int, latency.Term], bool]] = {}
        self._cap_kinds: dict[int, tuple[latency.Term, float]] | None = None  # `cap_kinds`, once asked
        self._spare: dict[tuple, float] = {}  # `spare`'s answers by host state
        draining = {hid for hid, hl in loads.items() if hl.host.state == "draining"}
        now, keep_warm = fleet.now, params.keep_warm_s
        get, own, queued, suspended, idle = loads.get, self.owned.add, self.queued, self.suspended, self.idle
        for s in fleet.sessions:  # the hot loop: every session once, nothing but sorting
            st = s.state
            if st == "queued":
                queued.append(s)
                continue
            hid = s.host_id
            if st == "suspended":
                suspended.append(s)
                own(hid)
            else:
                hl = get(hid)
                if hl is not None:
                    hl.residents.append(s)  # owned: counted per host below
                else:
                    own(hid)
                if st == "serving" and keep_warm > 0 and now - s.last_input_at >= keep_warm:
                    idle.append(s)
            if draining and hid in draining and st != "moving":
                self.draining.setdefault(hid, []).append(s)
        for hl in loads.values():
            if hl.residents:
                own(hl.host_id)
                self._kinds(hl)
            self.refresh(hl)
        self._zone_nics = _zone_nics(self)
        # the two zones with the fastest open NICs, fastest first: the best way out of any other zone
        self._zone_tops = sorted(((z, n[0]) for z, n in self._zone_nics.items()), key=lambda zn: -zn[1])[:2]

    def _kinds(self, hl: HostLoad) -> None:
        """The host's distinct terms, from its residents' distinct (backend, contract) pairs.

        Hosts with the same profile and the same distinct pairs have the same kinds, and a fleet has far
        fewer such groups than hosts: each group's kinds are worked out once per decision and shared by
        its hosts until one is opened up (`open_up` copies them before any change)."""
        r = hl.residents
        profile = id(hl.host.entry.profile)
        pairs = frozenset({(s.backend, id(s.contract)) for s in r})
        group = self._groups.get((profile, pairs))
        if group is None:
            cache = self._terms.get(profile)
            if cache is None:
                cache = self._terms[profile] = {}
            kinds: dict[int, latency.Term] = {}
            missing = False
            for pair in pairs:
                t = cache.get(pair, _UNKNOWN)
                if t is _UNKNOWN:
                    t = self.term(next(s for s in r if (s.backend, id(s.contract)) == pair), hl)
                if t is None:
                    missing = True
                else:
                    kinds[id(t)] = t
            group = self._groups[(profile, pairs)] = (kinds, missing)
        hl.kinds, missing = group
        hl.n = len(r) if not missing else sum(1 for s in r if self.term(s, hl) is not None)

    def open_up(self, hl: HostLoad) -> dict[str, latency.Term]:
        """The host's per-session terms (built on first use, then kept current); `hl.members` alongside."""
        if hl.counts is None:
            hl.counts, hl.terms, hl.members = {}, {}, {}
            hl.kinds = dict(hl.kinds)  # its own from now on: `_kinds` shares one per group of hosts
            cache = self._terms.get(id(hl.host.entry.profile), _NONE)
            for s in hl.residents:
                t = cache.get((s.backend, id(s.contract)), _UNKNOWN)
                if t is _UNKNOWN:
                    t = self.term(s, hl)
                if t is not None:
                    hl.terms[s.session_id] = t
                    hl.members[s.session_id] = s
                    hl.counts[id(t)] = hl.counts.get(id(t), 0) + 1
        return hl.terms

    # ------------------------------------------------------------ capacity (libs.contracts)

    def row(self, s: Session, hl: HostLoad) -> ProfileRow | None:
        profile = hl.host.entry.profile
        key = (id(profile), s.backend, s.contract.quality_floor)
        if key not in self._rows:
            self._rows[key] = floor_row(profile, s.backend, s.contract.quality_floor)
        return self._rows[key]

    def term(self, s: Session, hl: HostLoad) -> latency.Term | None:
        cache = self._terms.get(id(hl.host.entry.profile))
        if cache is None:
            cache = self._terms[id(hl.host.entry.profile)] = {}
        key = (s.backend, id(s.contract))
        if key not in cache:
            row = self.row(s, hl)
            cache[key] = None if row is None else latency.term(s.contract, row, demand(s.contract, row).busy_fraction)
        return cache[key]

    def fit(self, s: Session, hl: HostLoad) -> Estimate:
        """Does `s` fit `hl` now (its heartbeat and this decision's pending demand). Asked of the same
        host for every session a step tries, so kept per contract until the host's pending demand grows."""
        cache = hl.fits
        if cache is None:
            cache = hl.fits = {}
        key = (s.backend, id(s.contract))  # contracts are the snapshot's, alive for the whole decision
        est = cache.get(key)
        if est is None:
            est = cache[key] = estimate(s.contract, s.backend, hl.host.entry, hl.pending, self.params.guard)
        return est

    # ------------------------------------------------------------ latency predictions

    def refresh(self, hl: HostLoad) -> None:
        hl.ms = latency.host_ms(self.params, hl.kinds.values(), hl.busy, hl.n)
        hl.room = None

    def room(self, hl: HostLoad) -> float:
        """The busiest `hl` may get with every session on it still within the latency target (inf where
        the latency model does not bound it by load): a cheap necessary test before `within_target`."""
        if hl.room is None:
            p = self.params
            hl.room = min((latency.busy_within(p, k) for k in hl.kinds.values()), default=math.inf)
        return hl.room

    def ms_with(self, hl: HostLoad, t: latency.Term) -> float:
        kinds = list(hl.kinds.values())
        if id(t) not in hl.kinds:
            kinds.append(t)
        return latency.host_ms(self.params, kinds, hl.busy + t.share, hl.n + 1)

    def within_target(self, s: Session, hl: HostLoad) -> bool:
        """With `s` added, every session on `hl` stays within its latency target (`latency.target_ms`)."""
        t = self.term(s, hl)
        if t is None:
            return False
        p = self.params
        busy, n = hl.busy + t.share, hl.n + 1
        for k in (t, *hl.kinds.values()):
            if latency.chunk_ms(p, k, busy, n) > latency.target_ms(p, k):
                return False
        return True

    def ms_without(self, hl: HostLoad, session_id: str) -> float:
        t = self.open_up(hl)[session_id]
        assert hl.counts is not None
        alone = hl.counts[id(t)] == 1
        kinds = [k for k in hl.kinds.values() if k is not t or not alone]
        return latency.host_ms(self.params, kinds, hl.busy - t.share, hl.n - 1)

    # ------------------------------------------------------------ room at a latency cap

    def cap_kinds(self, also: latency.Term | None = None) -> dict[int, tuple[latency.Term, float]]:
        """The distinct terms of the sessions on open hosts (and `also`), each with its weight at the cap
        (`latency.cap_weight`: the share of a host it takes), worked out once per decision."""
        if self._cap_kinds is None or (also is not None and id(also) not in self._cap_kinds):
            terms = {id(k): k for hl in self._open for k in hl.kinds.values()}
            if also is not None:
                terms[id(also)] = also
            lightest = min((k.share for k in terms.values()), default=0.0)
            self._cap_kinds = {i: (k, latency.cap_weight(self.params, k, lightest)) for i, k in terms.items()}
            self._spare = {}
        return self._cap_kinds

    def spare(self, kinds: tuple[latency.Term, ...], busy: float, n: int) -> float:
        """The room a host at (`kinds`, `busy`, `n`) has left within the cap that sessions can use, as a
        weight (hosts at the cap): the most that more sessions of any one of the fleet's classes would add
        (`cap_kinds`). An empty host has 1; a full one, or one only a class the fleet does not have would
        fit, 0. Cached by host state: a fleet has a few dozen."""
        key = (frozenset(id(k) for k in kinds), n, round(busy, 9))
        got = self._spare.get(key)
        if got is None:
            got = 0.0
            for t, w in self.cap_kinds().values():
                m, b, c, ks = 0, busy, n, kinds
                while m * w < 1.0 and latency.joins(self.params, ks, b, c, t):  # the guard's slots end it
                    m, b, c = m + 1, b + t.share, c + 1
                    if not any(k is t for k in ks):
                        ks = (*ks, t)
                got = max(got, min(1.0, m * w))
            self._spare[key] = got
        return got

    # ------------------------------------------------------------ applying this decision's actions

    def add(self, s: Session, hl: HostLoad, est: Estimate) -> None:
        self.claimed.add(s.session_id)
        hl.pending += (Demand(busy_fraction=est.busy_fraction, state_bytes=est.state_bytes),)
        hl.fits = None
        t = self.term(s, hl)
        if t is not None:
            self.open_up(hl)[s.session_id] = t
            hl.members[s.session_id] = s
            _count(hl, t, 1)
            hl.busy += t.share
        self.refresh(hl)

    def take_away(self, s: Session, hl: HostLoad) -> None:
        t = self.open_up(hl).pop(s.session_id, None)
        if t is not None:
            del hl.members[s.session_id]
            _count(hl, t, -1)
            hl.busy -= t.share
        self.refresh(hl)

    # ------------------------------------------------------------ moves

    def move_verdict(self, s: Session, src: HostLoad, dst: HostLoad) -> admissibility.MoveVerdict:
        p = self.params
        return admissibility.evaluate(admissibility.Transfer(
            state_bytes=s.state_bytes, dirty_rate_bps=s.dirty_rate_bps, horizon_s=p.move_horizon_s,
            bandwidth_bps=self.fleet.paths.rate(src.host, dst.host), setup_s=p.move_setup_s))

    def stall_ms(self, s: Session, bandwidth_bps: float, window_ms: float) -> float:
        """κ: a live move freezes the session for its last round, about one window's dirty bytes."""
        dirty = s.dirty_rate_bps * (window_ms or 1000.0) / 1e3
        return 1e3 * (self.params.move_setup_s + dirty / bandwidth_bps)

    def movable(self, s: Session) -> bool:
        p, now = self.params, self.fleet.now
        if s.state != "serving" or s.session_id in self.claimed:
            return False
        recent = [t for t in s.moves if t > now - p.move_window_s]
        if len(recent) >= p.max_moves_per_window:
            return False
        return not s.moves or now - max(s.moves) >= p.move_cooldown_s

    def escape_bps(self, hl: HostLoad) -> float:
        """The best rate out of this host to another open host: what a future move off it could use.

        O(1): the fastest open NIC of its own zone (not itself) and of the fastest other zone.
        """
        if hl.escape >= 0:
            return hl.escape
        paths, own = self.fleet.paths, hl.host.nic_bps or self.fleet.paths.default_bps
        best = 0.0
        zone = hl.host.zone
        nics = self._zone_nics.get(zone)
        if nics:
            if hl.open and nics[0] == own:
                nics = nics[1:]  # itself
            if nics:
                best = min(own, nics[0])
        other = next((top for z, top in self._zone_tops if z != zone), None)
        if other is not None:
            best = max(best, min(own, other, paths.cross_zone_bps))
        hl.escape = best
        return best

    def open_loads(self) -> list[HostLoad]:
        return list(self._open)  # a host's `open` is the snapshot's: the same all decision


def _count(hl: HostLoad, t: latency.Term, by: int) -> None:
    assert hl.counts is not None  # opened up
    c = hl.counts.get(id(t), 0) + by
    if c:
        hl.counts[id(t)] = c
        hl.kinds[id(t)] = t
    else:
        del hl.counts[id(t)]
        del hl.kinds[id(t)]
    hl.n += by


def _zone_nics(plan: Plan) -> dict[str, list[float]]:
    """Per zone, the two fastest NIC rates of its open hosts, fastest first."""
    out: dict[str, list[float]] = {}
    for hl in plan.open_loads():
        out.setdefault(hl.host.zone, []).append(hl.host.nic_bps or plan.fleet.paths.default_bps)
    for z, nics in out.items():
        out[z] = sorted(nics, reverse=True)[:2]
    return out
