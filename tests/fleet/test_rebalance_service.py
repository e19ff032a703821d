"""The placement service's rebalancer: no move while Γ stays at or below the threshold; above it, a live move
through the mover to the idle host, with every input applied exactly once across it."""

from __future__ import annotations

from libs.contracts import Contract
from tests.support.fleet import configure, holder
from tests.support.invariants import check_log, read_log
from tests.support.waiting import eventually

SIDS = ["r0", "r1", "r2"]
# A block every 600 ms, due 100 to a window: the profile model prices a chunk at the host's off-device
# overhead plus busy × window, so each session adds 100 blocks' worth to its host's predicted latency
# instead of one. See the test's second part. Admission prices every stage of a block (an avatar block is
# 25-90 ms on a loaded 2-core machine): three sessions on the one CPU device both hosts share fit widely.
HEAVY = Contract(session_class="C2a", quality_floor=1, determinism="T1", deadline_ms=60_000.0,
                 blocks_per_window=100)


async def test_rebalancing_waits_for_gain_above_threshold_then_moves_live(stack):
    # Idle offload off; a threshold no gain reaches: the controller decides every round and moves nothing.
    await stack.start(fleet_control=True, control_s=0.2, keep_warm_s=0.0, gain_threshold_ms=1e6,
                      move_cooldown_s=0.0)
    # The service's default start-up profile (the median of five blocks), not the stack's single block: a
    # lone block's wall time on this shared machine ranged from 2 to 37 ms between two hosts started together.
    await stack.engines_up("e0", "e1", SF_PROFILE_BLOCKS="5")
    for sid in SIDS:
        assert (await stack.create(sid, contract=HEAVY)).host_id == "e0"  # first fit: all on e0, e1 idle
        await stack.send(sid, 1, 2)
    for sid in SIDS:
        await eventually(lambda sid=sid: stack.consumed(sid, 2))
    lead = await eventually(lambda: _async(holder(stack)), 20)
    start = lead.fleet.rounds

    async def rounds_passed():
        return lead.fleet.rounds >= start + 10

    await eventually(rounds_passed, 30)
    for sid in SIDS:
        view = await stack.owner(sid)
        assert view.owner.server_id == "e0" and view.owner.version == 1, sid

    # Any positive gain now moves: e0 is the bottleneck, so a session goes to e1 by a live move. (η = 0 and a
    # predicted freeze near zero: with a real freeze a move of sessions this light may not pay for itself,
    # nor may its cut-over chunk become the worst, which is the point of both rules; this test is about the
    # threshold and the live move, so the freeze is taken out of the way.)
    #
    # The gain is positive only if a session's chunk on e1 (e1's off-device overhead, its start-up block
    # minus quantum, plus the session's share × window) is predicted below e0's worst (e0's overhead plus
    # its busy × window). With C1 sessions each one's load term is one quantum (a few tenths of a ms here),
    # so the sign of the gain was the sign of the difference between the two hosts' measured overheads,
    # which differs by several ms from one start to the next: 6 runs in 45 priced e1's chunk above e0's
    # worst (e.g. 8.4 ms against 4.3-5.2), saw no gain for 60 s and failed. HEAVY sessions make the load
    # term 100 blocks each: a gain of one session's load (seconds here), with two sessions' load as the
    # margin over the difference between the overheads.
    configure(stack, gain_threshold_ms=0.0, eta=0.0, move_setup_s=0.00001, path_bps=1e13)

    async def one_on_e1():
        for sid in SIDS:
            view = await stack.owner(sid)
            if view is not None and view.owner.server_id == "e1":
                return sid
        return None

    moved = await eventually(one_on_e1, 60)
    view = await stack.owner(moved)
    assert view.owner.version == 2  # one hand-off, by the mover's assign: no failover, no re-placement

    async def path_measured():  # the mover's receipt taught every placement instance the path's rate
        return all(p.fleet.paths.rate("e0", "e1", 0.0) > 0 for p in stack.placements)

    await eventually(path_measured, 10)
    assert (await stack.placements[0].fleet.round()).actions is not None  # plans with it: no error
    for sid in SIDS:
        await stack.send(sid, 3, 4)
        await eventually(lambda sid=sid: stack.consumed(sid, 4), 30)
        check_log(await read_log(stack.js, sid))
    configure(stack, fleet_control=False)  # no move left in flight when the stack stops

    async def settled():
        return not any(p.fleet.busy for p in stack.placements)

    await eventually(settled, 30)


async def _async(value):
    return value
