"""Two fence invariants a mutation campaign broke without any test noticing (issue 22): each test here
was seen failing against its violation before the violation was taken out again.

- The claimed owner moves its checkpoint only forward: one behind the recorded one is refused and
  the recorded one stays.
- An assign that names an incarnation is claimed by that incarnation only, even before it has
  claimed (the earlier tests sent the other incarnation's claim only after the named one's landed,
  when "already claimed" refused it for another reason).
"""

from __future__ import annotations

import pytest

from libs import bus, names
from libs.errors import Conflict
from libs.fence import core, ownership
from libs.fence.client import EngineClient
from libs.schemas.fence import ClaimReply, ClaimRequest, MetaRequest, SessionMeta, SessionView
from tests.support.fence import register


async def test_a_checkpoint_behind_the_recorded_one_is_refused_and_changes_nothing(nc, fence):
    sid = "ckpt-back"
    await register(nc, sid)
    await ownership.assign(nc, sid, "A")
    client = EngineClient(nc, nc.jetstream(), "A")
    await client.start()
    try:
        await client.claim(sid, 1, 0)
        await client.checkpoint(sid, 1, "ref-5", cursor=5, block=5)
        for cursor, block in ((3, 5), (5, 3), (3, 3)):
            with pytest.raises(Conflict):
                await client.checkpoint(sid, 1, f"ref-{cursor}-{block}", cursor=cursor, block=block)
    finally:
        await client.close()
    meta = await bus.request(nc, names.FENCE_META, MetaRequest(session_id=sid), SessionMeta)
    assert (meta.checkpoint_ref, meta.checkpoint_cursor, meta.checkpoint_block) == ("ref-5", 5, 5)


def test_the_core_refuses_another_incarnations_claim_before_the_named_one_claimed():
    view = core.apply(SessionView(), core.decide_assign(SessionView(), "h1", 1, incarnation="inc-a"))
    with pytest.raises(Conflict):
        core.decide_claim(view, "h1", 1, 0, incarnation="inc-b")
    with pytest.raises(Conflict):
        core.decide_claim(view, "h1", 1, 0)  # naming none is not naming the right one
    assert core.decide_claim(view, "h1", 1, 0, incarnation="inc-a").incarnation == "inc-a"


async def test_fence_refuses_another_incarnations_claim_before_the_named_one_claimed(nc, fence):
    sid = "inc-first"
    await register(nc, sid)
    await ownership.assign(nc, sid, "h1", incarnation="inc-a")
    with pytest.raises(Conflict):
        await bus.request(nc, names.FENCE_CLAIM, ClaimRequest(session_id=sid, server_id="h1", version=1, cursor=0,
                                                              incarnation="inc-b", claim_id="b-1"), ClaimReply)
    view = (await ownership.read_owner(nc.jetstream(), sid)).view
    assert view.claim is None  # nothing was appended for the wrong process
    reply = await bus.request(nc, names.FENCE_CLAIM, ClaimRequest(
        session_id=sid, server_id="h1", version=1, cursor=0, incarnation="inc-a", claim_id="a-1"), ClaimReply)
    assert reply.version == 1
    assert (await ownership.read_owner(nc.jetstream(), sid)).view.incarnation == "inc-a"
