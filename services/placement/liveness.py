"""Which engine-host processes are alive, from the `sf_engines` heartbeat watch. Pure: the clock passed in.

A host process (host id + incarnation) is dead when
- its heartbeat entry is deleted (a clean stop), or
- no heartbeat reached us for `beats` of its own declared heartbeat intervals (a crash, a
  stopped process, a partition; KV TTL expiry raises no watch event, so silence is the signal), or
- the same host id beats with another incarnation (a restarted process inherits nothing).

Silence only counts while we can hear: while placement's own connection or watch is down,
every deadline is pushed back, and once the bus is back every host gets `bus_reconnect_grace_s`
to reconnect and beat again (their entries may have expired by TTL meanwhile, and they come
back on their own reconnect schedule), so a bus outage never reads as the fleet dying.

The bus can also fail beneath hosts while placement stays connected (a JetStream leader election:
heartbeat writes go unanswered while our watch stays up). So with two or more hosts, when no host at
all was heard for a whole heartbeat interval, a host's silence does not count either: hosts do not
die together, their shared bus does (and no host would be left to take a dead one's sessions). That
holds for at most `fleet_quiet_limit_s`, after which silence counts again (every host really gone);
when beats resume after such a gap, every host gets `quiet_grace_s` to be heard again.

An owner whose incarnation we never saw may be newer than our view (a claim can land just
before its host's first heartbeat reaches us): it is given `unknown_grace_s` before it
counts as dead, which also covers a placement that started after that process died.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from libs.schemas.common import EngineEntry


@dataclass(frozen=True, slots=True)
class Death:
    host_id: str
    incarnation: str
    reason: str  # deleted | silent | new_incarnation
    successor: str = ""  # the new incarnation, for new_incarnation


@dataclass(slots=True)
class _Seen:
    entry: EngineEntry
    deadline: float


@dataclass(slots=True)
class Liveness:
    beats: int = 3  # heartbeat intervals without a beat before a host is dead
    default_heartbeat_s: float = 2.0  # for an entry that does not declare its interval
    unknown_grace_s: float = 6.0
    fleet_quiet_limit_s: float = 30.0
    quiet_grace_s: float = 10.0
    live: dict[str, _Seen] = field(default_factory=dict)
    dead: dict[str, set[str]] = field(default_factory=dict)  # host id → its incarnations known dead
    _unknown: dict[tuple[str, str], float] = field(default_factory=dict)  # (host, inc) → first asked about
    _last_beat: float | None = None  # when any host was last heard

    def observe(self, entry: EngineEntry, now: float) -> list[Death]:
        """A heartbeat arrived at `now`."""
        if self._last_beat is not None and now - self._last_beat > self.beats * self._longest_interval():
            self.postpone(now, self.quiet_grace_s)  # the fleet was quiet: the others are reconnecting too
        self._last_beat = now
        deaths = []
        seen = self.live.get(entry.host_id)
        if seen is not None and seen.entry.incarnation != entry.incarnation:
            deaths.append(self._bury(entry.host_id, "new_incarnation", successor=entry.incarnation))
        self.dead.get(entry.host_id, set()).discard(entry.incarnation)  # a silent process that came back
        self._unknown.pop((entry.host_id, entry.incarnation), None)
        self.live[entry.host_id] = _Seen(entry, now + self.beats * (entry.heartbeat_s or self.default_heartbeat_s))
        return deaths

    def deleted(self, host_id: str) -> list[Death]:
        return [self._bury(host_id, "deleted")] if host_id in self.live else []

    def expire(self, now: float) -> list[Death]:
        """Every live host whose heartbeats stopped (unless every host fell quiet: see the module doc)."""
        silent = [h for h, s in self.live.items() if s.deadline <= now]
        if silent and self.fleet_quiet(now):
            self.postpone(now)
            return []
        return [self._bury(h, "silent") for h in silent]

    def fleet_quiet(self, now: float) -> bool:
        """No host of two or more was heard for a whole interval, and not yet for `fleet_quiet_limit_s`."""
        if len(self.live) < 2 or self._last_beat is None:
            return False
        quiet = now - self._last_beat
        return self._longest_interval() < quiet < self.fleet_quiet_limit_s

    def _longest_interval(self) -> float:
        return max((s.entry.heartbeat_s or self.default_heartbeat_s for s in self.live.values()),
                   default=self.default_heartbeat_s)

    def postpone(self, now: float, grace_s: float = 0.0) -> None:
        """While heartbeats cannot reach us, no host's silence counts: every deadline starts again at `now`
        (and lies at least `grace_s` ahead: after our own outage, hosts need time to reconnect and beat)."""
        for s in self.live.values():
            wait = max(grace_s, self.beats * (s.entry.heartbeat_s or self.default_heartbeat_s))
            s.deadline = max(s.deadline, now + wait)

    def next_deadline(self) -> float | None:
        return min((s.deadline for s in self.live.values()), default=None)

    def _bury(self, host_id: str, reason: str, successor: str = "") -> Death:
        seen = self.live.pop(host_id)
        self.dead.setdefault(host_id, set()).add(seen.entry.incarnation)
        return Death(host_id, seen.entry.incarnation, reason, successor)

    # ------------------------------------------------------------ questions

    def hosts(self) -> list[EngineEntry]:
        return [s.entry for s in self.live.values()]

    def entry(self, host_id: str) -> EngineEntry | None:
        seen = self.live.get(host_id)
        return seen.entry if seen else None

    def owner_alive(self, host_id: str, incarnation: str, now: float) -> bool | None:
        """True / False, or None while it cannot be told yet (an incarnation not seen, within its grace)."""
        seen = self.live.get(host_id)
        if seen is None:
            return False
        if not incarnation or incarnation == seen.entry.incarnation:
            return True
        if incarnation in self.dead.get(host_id, ()):
            return False
        first = self._unknown.setdefault((host_id, incarnation), now)
        if now - first >= self.unknown_grace_s:
            return False
        return None
