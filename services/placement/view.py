"""What one placement instance sees of the fleet, read-only: the four mirrored buckets and host liveness.

Everything here is a hint kept current by watches (`mirror.py`) and heartbeats (`liveness.py`);
decisions are compare-and-set writes elsewhere (`reservations.py`, fence's `assign`). The only
writes this class takes are the mirrors' own deliveries and `wrote`, a record this process has
just written itself.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from libs.errors import NotFound
from libs.schemas.admission import SessionRecord
from libs.schemas.common import EngineEntry, SessionSummary
from libs.schemas.placement import HostInfo, HostRecord
from services.placement.liveness import Liveness
from services.placement.mirror import KvMirror


@dataclass(slots=True)
class FleetView:
    liveness: Liveness
    engines: KvMirror[EngineEntry]  # heartbeats (`sf_engines`)
    hosts: KvMirror[HostRecord]  # lifecycle state and reservations (`sf_capacity`)
    sessions: KvMirror[SessionSummary]  # which host owns which session (`sf_sessions`)
    admissions: KvMirror[SessionRecord]  # admission's queue: load the autoscaler must see (`sf_admission`)

    def live_hosts(self) -> list[EngineEntry]:
        return self.liveness.hosts()

    def entry(self, host_id: str) -> EngineEntry | None:
        return self.liveness.entry(host_id)

    def is_live(self, host_id: str) -> bool:
        return host_id in self.liveness.live

    def up_hosts(self) -> list[EngineEntry]:
        """Live hosts that take work (not draining or drained)."""
        return [h for h in self.live_hosts()
                if (r := self.hosts.values.get(h.host_id)) is None or r.state == "up"]

    def records(self) -> dict[str, HostRecord]:
        return self.hosts.values

    def summaries(self) -> dict[str, SessionSummary]:
        return self.sessions.values

    def queued(self) -> list[SessionRecord]:
        return list(self.admissions.values.values())

    def owned(self, host_id: str) -> list[SessionSummary]:
        """Sessions the `sf_sessions` hint says `host_id` owns."""
        return [s for s in self.sessions.values.values() if s.owner_server_id == host_id and s.state != "closed"]

    def host_of(self, session_id: str) -> str:
        """The host the `sf_sessions` hint says owns the session ("" when it names none)."""
        s = self.sessions.values.get(session_id)
        return s.owner_server_id if s is not None else ""

    def check_known(self, host_id: str) -> None:
        """`NotFound` for a host id placement has never seen beat nor holds a record of."""
        if host_id not in self.liveness.live and host_id not in self.hosts.values:
            raise NotFound(f"no engine host {host_id}", host_id=host_id, field="host_id")

    def host_ids(self) -> set[str]:
        return set(self.liveness.live) | set(self.hosts.values) | set(self.liveness.dead)

    def host_info(self, host_id: str, record: HostRecord | None = None) -> HostInfo:
        """The host as placement sees it; `record` is one just written (the mirror may not show it yet)."""
        entry = self.liveness.entry(host_id)
        record = record or self.hosts.values.get(host_id)
        state = "dead" if entry is None else (record.state if record else "up")
        return HostInfo(host_id=host_id, state=state,
                        incarnation=entry.incarnation if entry else (record.incarnation if record else ""),
                        sessions=len(self.owned(host_id)), reserved=len(record.sessions) if record else 0,
                        busy_fraction=entry.busy_fraction if entry else 0.0,
                        heartbeat_age_s=max(0.0, time.time() - entry.heartbeat_at) if entry else 0.0)
