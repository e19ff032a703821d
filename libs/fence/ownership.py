"""Ownership as the other services ask for it: `assign` (placement, mover, failover) and reading the owner.

`assign` asks fence (`sf.fence.assign`), the ownership log's only writer, which
runs `services/fence/ownership_log.append_assign`: a compare-and-set append, version =
previous + 1 at the log position read. Without `expect_version` it retries on a lost race (the caller wants this
server to own the session whatever happened meanwhile); with it, a session that
moved on since the caller looked is a `Conflict`, never a silent overwrite.

Engines claim through `sf.fence.claim` (`libs/fence/client.EngineClient.claim`); fence runs
`ownership_log.append_claim`, which answers a repeated request of the same claimant with the claim it made.
"""

from __future__ import annotations

from dataclasses import dataclass

from libs import bus, names
from libs.fence import session_log
from libs.schemas.fence import AssignReply, AssignRequest


@dataclass(frozen=True, slots=True)
class Assigned:
    session_id: str
    server_id: str
    version: int
    log_seq: int


async def assign(nc: bus.Client, session_id: str, server_id: str, *,
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


async def read_owner(js: bus.JetStream, session_id: str) -> session_log.Tail:
    """The log's latest view of the session: a hint (the next CAS decides)."""
    return await session_log.read_tail(js, session_log.check_session_id(session_id))
