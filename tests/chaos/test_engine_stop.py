"""An engine host is SIGSTOPped (a partition, a stalled VM) past its heartbeat expiry, its sessions
go to another host, and then it resumes: it must not apply input or publish output after its
replacement claims.

Nobody helps: placement sees the heartbeat expire and fails the sessions over by itself (an assign at
version + 1 that lands only if the stopped host still holds the version placement saw); the drill
only waits for the replacement's claims.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time

import pytest

from bench.audit import read_log
from libs import bus, names
from libs.fence.ownership import read_owner
from libs.schemas.engine import SessionInfo, SessionRef
from libs.schemas.fence import Assign, Owner, Release
from tests.support.chaos import assert_clean, record

pytestmark = pytest.mark.chaos


async def _heartbeat_expired(nc, host_id: str, timeout_s: float = 30.0) -> None:
    kv = await nc.jetstream().key_value(names.ENGINES_BUCKET)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            keys = await kv.keys()
        except Exception:  # nats-py raises when the bucket is empty
            keys = []
        if host_id not in keys:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{host_id}'s heartbeat never expired")


async def _failed_over(js, old: dict[str, Owner], timeout_s: float = 60.0) -> None:
    """Placement has reassigned every one of `old`'s sessions and the replacement has claimed it."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        views = [(await read_owner(js, sid)).view for sid in old]
        if all(v.owner is not None and v.owner.version > old[sid].version and v.claim == v.owner
               for sid, v in zip(old, views, strict=True)):
            return
        await asyncio.sleep(0.1)
    raise AssertionError("placement did not fail the stopped host's sessions over")


async def test_sigstopped_engine_host_resumes_after_its_replacement_claimed(drill, chaos_results):
    d = await drill(engines=2)
    clients = await d.open(3)
    stopped = clients[0].host_id
    js = d.nc.jetstream()
    old: dict[str, Owner] = {}
    for c in clients:
        view = (await read_owner(js, c.sid)).view
        if view.owner is not None and view.owner.server_id == stopped:
            old[c.sid] = view.owner
    assert old, "no session was on the host about to stop"
    d.stack.signal(stopped, signal.SIGSTOP)
    at = d.fault(f"SIGSTOP {stopped} past its heartbeat expiry, then SIGCONT")
    await _heartbeat_expired(d.nc, stopped)
    await _failed_over(js, old)
    await d.recovered(at)
    d.stack.signal(stopped, signal.SIGCONT)  # it still believes it owns them, with input in hand
    await asyncio.sleep(3.0)
    await d.serving()
    # Invariant: the resumed host never folds in an item fence did not release to it. Placement may
    # give a session back to it once its heartbeat returns (a newer version on the same host): items
    # released to that version are its own, so the bound is every release addressed to this host.
    applied_after_takeover = 0
    given_back = 0
    for sid, owner in old.items():
        log = await read_log(js, sid)
        released = [i.seq for r in log if isinstance(r.event, Release) and r.event.server_id == stopped
                    for i in r.event.items]
        given_back += any(isinstance(r.event, Assign) and r.event.server_id == stopped
                          and r.event.version > owner.version for r in log)
        with contextlib.suppress(Exception):  # gone already: it closed its orphaned copy
            info = await bus.request(d.nc, names.engine_subject(stopped, "info"), SessionRef(session_id=sid),
                                     SessionInfo, timeout_s=2.0)
            applied_after_takeover += max(0, info.consumed_seq - max(released, default=0))
    audits = await d.finish()
    row = record(chaos_results, "engine_sigstop_past_heartbeat", d, audits,
                 sessions_moved=len(old), applied_by_old_owner_after_takeover=applied_after_takeover,
                 sessions_given_back_to_resumed_host=given_back,
                 reassigned_by="placement's automatic failover")
    assert applied_after_takeover == 0, row
    assert_clean(row)
