"""Host failover on a real stack: engine hosts are processes that die by SIGKILL, stop by SIGSTOP, or restart.

Each test checks the fencing invariants over every session's whole log (tests/support/invariants.py), and that
the new owner's state folded in every accepted item exactly once (the runtime refuses gaps and duplicates,
so `consumed_seq == input_cursor == n` means items 1..n each came once)."""

from __future__ import annotations

import asyncio
import signal

import pytest

from libs import bus, names
from libs.contracts import Contract
from libs.fence import block_journal
from libs.fence.replay import replay_plan
from libs.schemas.engine import OutputChunk
from libs.schemas.fence import AssignRequest, MetaRequest, SessionMeta
from libs.schemas.motion import MoveReceipt, MoveRequest
from services.fence import ownership_log
from services.fence.service import FenceConfig, FenceService
from tests.support.invariants import check_log, read_log
from tests.support.stack import crash
from tests.support.waiting import eventually


async def checkpointed(stack, sid: str, cursor: int):
    meta = await bus.request(stack.nc, names.FENCE_META, MetaRequest(session_id=sid), SessionMeta)
    return meta.checkpoint_cursor >= cursor


async def test_sigkilled_owner_is_reclaimed_at_a_higher_version_and_its_restart_resurrects_nothing(stack):
    await stack.start()
    await stack.engines_up("e0", "e1", "e2")
    sids = ["k0", "k1"]
    for sid in sids:
        assert (await stack.create(sid)).host_id == "e0"  # first fit
        await stack.send(sid, 1, 5)
    for sid in sids:
        await eventually(lambda sid=sid: stack.consumed(sid, 5))
        await eventually(lambda sid=sid: checkpointed(stack, sid, 5))
    old = stack.placements[0].liveness.entry("e0").incarnation
    stack.engines["e0"].kill()
    stack.engines["e0"].start()  # the supervisor's restart: same host id, a new incarnation
    for sid in sids:
        await stack.send(sid, 6, 8)  # accepted while the owner is dead: kept, and served after failover
    for sid in sids:
        view = await eventually(lambda sid=sid: stack.claimed_by(sid, min_version=2), 20)
        assert view.owner.server_id in ("e1", "e2") and view.owner.version == 2 and view.incarnation != old
        await eventually(lambda sid=sid: stack.consumed(sid, 8))
        check_log(await read_log(stack.js, sid))
    await eventually(lambda: stack.answers("e0"), 60)
    await asyncio.sleep(1.0)
    for sid in sids:  # the restarted process took nothing of its predecessor's, and nothing was reassigned since
        assert (await stack.owner(sid)).owner.version == 2
        assert await stack.info("e0", sid) is None


async def test_a_partitioned_old_owner_applies_nothing_after_the_replacement_claims(stack):
    await stack.start()
    await stack.engines_up("e0", "e1")
    await stack.create("p0")
    await stack.send("p0", 1, 4)
    await eventually(lambda: stack.consumed("p0", 4))
    await eventually(lambda: checkpointed(stack, "p0", 4))
    stack.engines["e0"].signal(signal.SIGSTOP)
    await stack.send("p0", 5, 7)  # released to the stopped owner: they wait in its consumer
    await eventually(lambda: stack.claimed_by("p0", "e1", min_version=2), 20)
    stack.engines["e0"].signal(signal.SIGCONT)
    await eventually(lambda: stack.consumed("p0", 7))
    await asyncio.sleep(1.5)  # time for the resumed process to read what waited for it
    stale = await stack.info("e0", "p0")
    assert stale is None or stale.consumed_seq == 4  # closed, or still at what it had before the stop
    check_log(await read_log(stack.js, "p0"))


@pytest.mark.timeout(120)
async def test_killing_a_placement_instance_mid_failover_loses_nothing(stack):
    await stack.start()
    await stack.engines_up("e0", "e1", "e2")
    sids = [f"m{i}" for i in range(4)]
    for sid in sids:
        await stack.create(sid)
        await stack.send(sid, 1, 2)
    for sid in sids:
        await eventually(lambda sid=sid: stack.consumed(sid, 2))
    stack.engines["e0"].kill()

    async def first_reassigned():
        return any([await stack.claimed_by(sid, min_version=2) for sid in sids]) or any(
            [(await stack.owner(sid)) is None for sid in sids])

    await eventually(first_reassigned, 20, every_s=0.01)
    await crash(stack.placements[0])  # while it works through the dead host's sessions
    for sid in sids:
        view = await eventually(lambda sid=sid: stack.claimed_by(sid, min_version=2), 20)
        assert view.owner.version == 2  # exactly one reassign landed
        await eventually(lambda sid=sid: stack.consumed(sid, 2))
        check_log(await read_log(stack.js, sid))


async def test_a_moved_session_journals_every_block_it_publishes(stack):
    """Invariant (exact recovery): every block whose output went out is in the block journal, so a
    replacement can regenerate it. A live move hands the session to a host that has no journal until
    fence assigns it there and it claims; the moved-in copy runs no block before that."""
    await stack.start()
    # No checkpoint during the test: the journal keeps every block from the first one.
    await stack.engines_up("e0", "e1", SF_CHECKPOINT_EVERY_S="600")
    sid = "mv"
    await stack.create(sid, contract=Contract(session_class="C1", quality_floor=1, determinism="T1",
                                              period_ms=1000.0))  # blocks keep running; one avatar block fits
    live: set[int] = set()

    async def on_chunk(chunk: OutputChunk) -> None:
        if not chunk.replayed:
            live.add(chunk.block)

    await bus.subscribe_events(stack.nc, names.output_subject(sid), OutputChunk, on_chunk)
    await stack.send(sid, 1, 3)
    await eventually(lambda: stack.consumed(sid, 3))
    receipt = await bus.request(stack.nc, names.MOVER_MOVE, MoveRequest(session_id=sid, source="e0", dest="e1",
                                                                        deadline_s=10.0), MoveReceipt, timeout_s=30)
    assert receipt.outcome == "committed", receipt
    await eventually(lambda: stack.claimed_by(sid, "e1", min_version=2))
    await stack.send(sid, 4, 6)
    await eventually(lambda: stack.consumed(sid, 6))
    await asyncio.sleep(0.5)  # more blocks on the new owner
    _, tail = await block_journal.read_tail(stack.js, sid)
    plan = replay_plan([e for _, e in await block_journal.read_all(stack.js, sid, tail)], 0, 0)  # a gap raises
    journaled = {b.block for b in plan}
    assert journaled == set(range(1, len(plan) + 1)) and plan[-1].last_seq == 6
    assert not {b for b in live if b <= plan[-1].block} - journaled, "blocks published but never journaled"


async def test_an_assignment_taken_while_fence_is_down_is_claimed_once_fence_returns(stack):
    """A replacement that cannot reach fence (a restart, a leader election) keeps taking its assignment
    until it can: giving up would leave the session assigned to it and served by nobody."""
    await stack.start(placements=1)
    await stack.engines_up("e0", "e1")
    sid = "t0"
    assert (await stack.create(sid)).host_id == "e0"  # first fit
    await stack.send(sid, 1, 3)
    await eventually(lambda: stack.consumed(sid, 3))
    await crash(stack.fence)
    # What fence's assign verb runs, run here while no fence answers: e1 is named in the log and told so,
    # and its requests for the session's meta and its claim go unanswered.
    await ownership_log.append_assign(stack.nc, stack.js, AssignRequest(session_id=sid, server_id="e1",
                                                                    expect_version=1))
    await asyncio.sleep(2.0)
    assert await stack.claimed_by(sid, "e1", min_version=2) is None
    stack.fence = await stack._service(FenceService(FenceConfig(nats_url=stack.url, http_port=0, log_json=False)))
    await eventually(lambda: stack.claimed_by(sid, "e1", min_version=2), 30)
    await stack.send(sid, 4, 5)
    await eventually(lambda: stack.consumed(sid, 5))
    check_log(await read_log(stack.js, sid))
