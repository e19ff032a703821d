"""The ownership log's appends, run by fence only (its one writer): `sf.fence.assign` and `sf.fence.claim`.

Each is a compare-and-set on the session log's tail (`libs/fence/session_log.append`): the pure core
(`libs/fence/core.py`) decides on the tail as read, the append lands only at the position read, and a
lost race reads and decides again. The clients that ask for them live in `libs/fence/ownership.py`
(`assign`) and `libs/fence/client.py` (the engine's claim).
"""

from __future__ import annotations

import structlog

from libs import bus, errors, names
from libs.fence import core, session_log
from libs.schemas.base import encode
from libs.schemas.fence import AssignNotice, AssignReply, AssignRequest, Claim, ClaimReply, ClaimRequest
from services.fence.summaries import update_summary

_log = structlog.get_logger("statefleet.fence")


async def append_assign(nc: bus.Client, js: bus.JetStream, request: AssignRequest) -> AssignReply:
    """The append behind `sf.fence.assign` (run by fence only): a compare-and-set on the log, then a notice."""
    session_id, server_id, expect_version = request.session_id, request.server_id, request.expect_version
    session_log.check_session_id(session_id)
    session_log.check_server_id(server_id)
    for _ in range(bus.MAX_CAS_ATTEMPTS):
        tail = await session_log.read_tail(js, session_id)
        latest = tail.view.owner.version if tail.view.owner else 0
        if expect_version is not None and latest != expect_version:
            raise errors.Conflict(f"session is at version {latest}, not {expect_version}",
                                  session_id=session_id, latest=latest, expected=expect_version)
        event = core.decide_assign(tail.view, server_id, latest + 1, request.incarnation)
        try:
            new = await session_log.append(js, session_id, tail, event)
        except errors.Conflict:
            continue
        await nc.publish(names.assigned_subject(server_id), encode(AssignNotice(
            session_id=session_id, server_id=server_id, version=event.version, log_seq=new.seq)))
        await update_summary(js, session_id, new.view)
        _log.info("assigned", session_id=session_id, server_id=server_id, version=event.version, log_seq=new.seq)
        return AssignReply(session_id=session_id, server_id=server_id, version=event.version, log_seq=new.seq)
    raise errors.Conflict("assign kept losing the race", session_id=session_id)


async def append_claim(js: bus.JetStream, request: ClaimRequest) -> ClaimReply:
    """The append behind `sf.fence.claim` (run by fence only): the core decides on the log tail, the CAS
    lands it. The engine retries a request whose answer it lost (a leader election, a fence restart),
    so a claim already standing for this same claimant is answered again instead of refused."""
    session_id = session_log.check_session_id(request.session_id)
    server_id, version = session_log.check_server_id(request.server_id), request.version
    asked = Claim(server_id=server_id, version=version, cursor=request.cursor, incarnation=request.incarnation,
                  claim_id=request.claim_id)
    for _ in range(bus.MAX_CAS_ATTEMPTS):
        tail = await session_log.read_tail(js, session_id)
        if core.claimed_by(tail.view, asked):  # a repeat of a request whose claim landed (its answer was lost)
            return ClaimReply(session_id=session_id, server_id=server_id, version=version, log_seq=0)
        event = core.decide_claim(tail.view, server_id, version, request.cursor, incarnation=request.incarnation,
                                  claim_id=request.claim_id)
        try:
            new = await session_log.append(js, session_id, tail, event)
        except errors.Conflict:
            continue  # something landed meanwhile: decide again on the new tail
        await update_summary(js, session_id, new.view)
        _log.info("claimed", session_id=session_id, server_id=server_id, version=version, cursor=request.cursor,
                  log_seq=new.seq)
        return ClaimReply(session_id=session_id, server_id=server_id, version=version, log_seq=new.seq)
    raise errors.Conflict("claim kept losing the race", session_id=session_id)
