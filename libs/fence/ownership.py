"""Ownership as the other services ask for it: `assign` (placement, mover, failover), reading the owner,
and the `sf_sessions` hint.

`assign` asks fence (`sf.fence.assign`), the ownership log's only writer, which
runs `services/fence/ownership_log.append_assign`: a compare-and-set append, version =
previous + 1 at the log position read. Without `expect_version` it retries on a lost race (the caller wants this
server to own the session whatever happened meanwhile); with it, a session that
moved on since the caller looked is a `Conflict`, never a silent overwrite.

Engines claim through `sf.fence.claim` (`libs/fence/client.EngineClient.claim`); fence runs
`ownership_log.append_claim`, which answers a repeated request of the same claimant with the claim it made.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import structlog
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from libs import bus, names
from libs.fence import core, session_log
from libs.schemas.base import decode, encode
from libs.schemas.common import SessionSummary
from libs.schemas.fence import (
    AssignReply,
    AssignRequest,
    SessionView,
)

_log = structlog.get_logger("statefleet.fence")


@dataclass(frozen=True, slots=True)
class Assigned:
    session_id: str
    server_id: str
    version: int
    log_seq: int


async def assign(nc: NATS, session_id: str, server_id: str, *,
                 expect_version: int | None = None, incarnation: str = "") -> Assigned:
    """Ask fence to make `server_id` the assigned owner (unclaimed) with the next version.

    `incarnation` names the one process of `server_id` that may claim ("" = whichever runs there).

    Fence is the log's only writer (`names.FENCE_ASSIGN`): this asks it over the bus.
    """
    session_log.check_session_id(session_id)
    reply = await bus.request(nc, names.FENCE_ASSIGN, AssignRequest(
        session_id=session_id, server_id=server_id, expect_version=expect_version, incarnation=incarnation),
        AssignReply)
    return Assigned(reply.session_id, reply.server_id, reply.version, reply.log_seq)


async def read_owner(js: JetStreamContext, session_id: str) -> session_log.Tail:
    """The log's latest view of the session: a hint (the next CAS decides)."""
    return await session_log.read_tail(js, session_log.check_session_id(session_id))


async def update_summary(js: JetStreamContext, session_id: str, view: SessionView, **fields: str) -> None:
    """Refresh the `sf_sessions` hint for `statefleet status`; failures only cost freshness."""
    try:
        kv = await js.key_value(names.SESSIONS_BUCKET)
        try:
            summary = decode((await kv.get(session_id)).value, SessionSummary)
        except Exception:
            summary = SessionSummary(session_id=session_id)
        owner = view.owner
        summary.owner_server_id = owner.server_id if owner else ""
        summary.owner_version = owner.version if owner else 0
        summary.claimed = core.current_owner(view) is not None
        summary.owner_incarnation = view.incarnation
        summary.state = "closed" if view.closed else ("serving" if summary.claimed else
                                                       "assigned" if owner else "pending")
        summary.reason = ""  # a state's reason is the writer's to give with it
        for key, value in fields.items():
            setattr(summary, key, value)
        summary.updated_at = time.time()
        await kv.put(session_id, encode(summary))
    except Exception as e:
        _log.warning("session_summary_failed", session_id=session_id, error=str(e) or type(e).__name__)
