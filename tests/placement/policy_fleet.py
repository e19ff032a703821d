"""Fleet snapshots for the policy tests: hosts from measured-looking rows, C1 sessions, one path table."""

from __future__ import annotations

import msgspec

from libs import admissibility
from libs.contracts import Demand, Guard
from services.placement.policy import Fleet, Host, Params, PathRates, Session
from tests.support.fleet_rows import GIB, c1, host, rows

FAST = admissibility.gbps(100)
PATHS = PathRates(default_bps=FAST)
PARAMS = Params(guard=Guard(busy_fraction=0.1, memory_fraction=0.05, max_sessions=16), keep_warm_s=0.0,
                warm_pool_hosts=0, warm_pool_frac=0.0)
SHARE = {4: 0.1, 8: 0.2, 16: 0.4}  # quantum / period for the rows of tests.support.fleet_rows at 100 ms


def sess(sid: str, host_id: str = "", *, floor: int = 8, state: str | None = None, moves: tuple[float, ...] = (),
         last_input_at: float = 1000.0, suspended_at: float = 0.0, state_bytes: int = 2 * GIB,
         dirty: float = 0.5e9) -> Session:
    return Session(session_id=sid, backend="world", contract=c1(floor=floor),
                   state=state or ("serving" if host_id else "queued"), host_id=host_id, state_bytes=state_bytes,
                   dirty_rate_bps=dirty, last_input_at=last_input_at, suspended_at=suspended_at, moves=moves)


def fleet(hosts: dict[str, list[Session]], *, queued: tuple[Session, ...] = (), now: float = 1000.0,
          states: dict[str, str] | None = None, background: dict[str, float] | None = None,
          reserved: dict[str, tuple[Demand, ...]] | None = None, paths: PathRates = PATHS, **kw) -> Fleet:
    """Hosts named in `hosts`, each carrying the listed sessions (its heartbeat shows their demand)."""
    states, background, reserved = states or {}, background or {}, reserved or {}
    views, sessions = [], list(queued)
    for hid, on in hosts.items():
        resident = [s for s in on if s.state in ("serving", "moving")]
        busy = background.get(hid, 0.0) + sum(SHARE[s.contract.quality_floor] for s in resident)
        entry = host(hid, busy=busy, sessions=len(resident), free=80 * GIB - 2 * GIB * len(resident), at=now,
                     profile=ROWS)
        views.append(Host(entry=entry, state=states.get(hid, "up"), reserved=reserved.get(hid, ())))
        sessions += on
    return Fleet(now=now, hosts=tuple(views), sessions=tuple(sessions), paths=paths, **kw)


ROWS = rows()


def measured(f, **loads: float):
    """The fleet with each named host's measured load (what its stages ran), and the rest as priced."""
    hosts = tuple(msgspec.structs.replace(h, entry=msgspec.structs.replace(
        h.entry, measured_fraction=loads.get(h.host_id, h.entry.busy_fraction))) for h in f.hosts)
    return msgspec.structs.replace(f, hosts=hosts)


def shared(f, *host_ids: str):
    """The named hosts on one machine's CPU: one device."""
    hosts = tuple(msgspec.structs.replace(h, entry=msgspec.structs.replace(h.entry, machine="m", device="cpu"))
                  if h.host_id in host_ids else h for h in f.hosts)
    return msgspec.structs.replace(f, hosts=hosts)
