"""`statefleet engines`: every live engine host's sessions and serving metrics, asked over NATS."""

from __future__ import annotations

from libs import bus, errors, names
from libs.schemas.common import EngineEntry
from libs.schemas.engine import HostStatus, StatusRequest
from statefleet import json_out
from statefleet.status import default_nats_url, read_bucket


async def host_statuses(nats_url: str, host: str = "", timeout_s: float = 3.0) -> list[HostStatus | str]:
    """The status of each engine host in `sf_engines` (or just `host`); a host that does not answer
    appears as a line saying why."""
    nc = await bus.connect(nats_url, name="statefleet-engines")
    try:
        entries = await read_bucket(nc.jetstream(), names.ENGINES_BUCKET, EngineEntry)
        out: list[HostStatus | str] = []
        for e in sorted(entries, key=lambda e: e.host_id):
            if host and e.host_id != host:
                continue
            try:
                out.append(await bus.request(nc, names.engine_subject(e.host_id, "status"), StatusRequest(),
                                             HostStatus, timeout_s=timeout_s))
            except (errors.Timeout, errors.Unavailable) as err:
                out.append(f"{e.host_id}: {err.detail}")
        return out
    finally:
        await nc.close()


async def print_engines(nats_url: str, *, host: str = "", as_json: bool = False) -> int:
    statuses = await host_statuses(nats_url or default_nats_url(), host)
    if as_json:
        print(json_out.dumps(statuses))
        return 0
    for st in statuses:
        if isinstance(st, str):
            print(st)
            continue
        c = st.pipeline
        print(f"{st.host_id} {st.device}  busy {st.busy_fraction:.2f}  resident {st.state_bytes_resident / 2**20:.1f} MiB"
              f"  pipeline stale={c.stale} orphaned={c.orphaned} dup={c.duplicate} cleanup_fail={c.cleanup_failures}"
              f" slot_leaks={c.slot_leaks}")
        for s, m in zip(st.sessions, st.metrics, strict=True):
            print(f"  {s.session_id:<20} {s.backend:<7} {s.session_class:<4} {s.state:<9} tier {m.tier:<2} "
                  f"blocks {m.blocks:<6} skipped {m.skipped_blocks:<4} first {m.first_output_ms:7.1f} ms  "
                  f"period p50/p95 {m.chunk_period_p50_ms:6.1f}/{m.chunk_period_p95_ms:6.1f} ms  "
                  f"rtf p95 {m.rtf_p95:5.2f}  ctl→out p95 {m.control_to_output_p95_ms:6.1f} ms"
                  f"  hold p95 {m.playout_hold_p95_ms:5.1f} ms")
    return 0
