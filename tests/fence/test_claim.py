"""Engines claim through fence (`sf.fence.claim`), and asking again is safe.

The engine retries a claim whose answer it lost (fence restarting, a JetStream leader
election); the claim may have landed meanwhile. Invariant: one claimant's repeated requests
(same `claim_id`) put exactly one `Claim` in the log and are all answered as granted; any other
claim (a new request of the same process, another process, another version) is refused.
"""

from __future__ import annotations

import asyncio

import pytest

from libs import bus, errors, names
from libs.fence import ownership
from libs.fence.client import EngineClient
from libs.schemas.fence import Claim, ClaimReply, ClaimRequest
from tests.support.fence import register, start_fence
from tests.support.invariants import read_log

SID = "claim-1"


def request(version: int, incarnation: str = "p1", claim_id: str = "c1") -> ClaimRequest:
    return ClaimRequest(session_id=SID, server_id="E", version=version, cursor=0, incarnation=incarnation,
                        claim_id=claim_id)


async def test_a_repeated_claim_is_granted_again_and_lands_once(fence, nc):
    js = nc.jetstream()
    await register(nc, SID)
    assigned = await ownership.assign(nc, SID, "E", incarnation="p1")
    first = await bus.request(nc, names.FENCE_CLAIM, request(assigned.version), ClaimReply)
    again = await bus.request(nc, names.FENCE_CLAIM, request(assigned.version), ClaimReply)
    assert first.log_seq > 0 and again.log_seq == 0  # the second found the first's claim
    # Another claim of the same assignment, even by the same process, is no repeat: refused.
    for other in (request(assigned.version, claim_id="c2"), request(assigned.version, incarnation="p2"),
                  request(assigned.version + 1)):
        with pytest.raises(errors.Conflict):
            await bus.request(nc, names.FENCE_CLAIM, other, ClaimReply)
    claims = [r for r in await read_log(js, SID) if isinstance(r.event, Claim)]
    assert len(claims) == 1 and claims[0].event.incarnation == "p1"


async def test_a_claim_asked_while_fence_is_down_lands_when_it_is_back(nats_server, nc):
    js = nc.jetstream()
    fence = await start_fence(nats_server.url, "fence-a")
    await register(nc, SID)
    assigned = await ownership.assign(nc, SID, "E")
    await fence.stop()
    client = EngineClient(nc, js, "E")
    await client.start()
    claiming = asyncio.create_task(client.claim(SID, assigned.version, cursor=0))
    await asyncio.sleep(0.5)  # unanswered (no fence): the client keeps asking
    assert not claiming.done()
    fence = await start_fence(nats_server.url, "fence-b")
    try:
        lease = await asyncio.wait_for(claiming, 20)
        assert (await ownership.read_owner(js, SID)).view.claim == lease.owner
    finally:
        await client.close()
        await fence.stop()
