"""A move between two motion endpoints "a" (the source) and "b" (the destination) driven verb by verb over the
bus, as the mover drives one (issue 22: shared from here, not from a test module)."""

from __future__ import annotations

from libs import bus, names
from libs.schemas.motion import (
    AdmitMove,
    AdmitVerdict,
    Manifest,
    Migrate,
    MigrateResult,
    SlotDone,
    SlotRequest,
    Verified,
)


def verb(host: str, name: str) -> str:
    return names.engine_subject(host, name)


async def admit(nc, m: Manifest, move_id: str, **kw) -> AdmitVerdict:
    req = dict(session_id=m.session_id, move_id=move_id, state_bytes=m.total_bytes, dirty_rate_bps=0.0,
               horizon_s=10.0, bandwidth_bps=1e9) | kw
    return await bus.request(nc, verb("b", "admit"), AdmitMove(**req), AdmitVerdict)


async def migrate(nc, v: AdmitVerdict, move_id: str, **kw) -> MigrateResult:
    req = dict(session_id="s", move_id=move_id, dest_host="b", dest_addr=v.data_addr, token=v.token,
               chunk_bytes=32 << 10) | kw
    return await bus.request(nc, verb("a", "migrate"), Migrate(**req), MigrateResult, timeout_s=30)


async def finish(nc, move_id: str, m: Manifest) -> None:
    slot = SlotRequest(session_id="s", move_id=move_id, manifest=m)
    assert (await bus.request(nc, verb("b", "verify"), slot, Verified)).ok
    await bus.request(nc, verb("b", "commit"), slot, SlotDone)
    await bus.request(nc, verb("a", "commit"), SlotRequest(session_id="s", move_id=move_id), SlotDone)
