"""A host that learned a high price while slow, then idled, takes sessions again (issue 29), on a real stack.

In the full `bench.failover --hog 2` run a host served sessions while two other stacks loaded the machine,
learned a block price above their period, and its sessions left; with no quantum run since, its price
never changed, and placement refused it every stranded session as `period` until the run ended. Here one
engine-host process's denoise stage is switched up while it serves (its heartbeat's rows then price a
block above the session's period), the session closes, and the stage is switched back: with the learned
price relaxing toward the start-up measurement (`costs.HALF_LIFE_S`), the idle host takes a new session."""

from __future__ import annotations

import pytest

from libs import bus, names
from libs.contracts import Contract
from libs.errors import Rejected
from libs.schemas.fence import CloseReply, CloseRequest
from libs.schemas.placement import Placement, PlaceRequest
from tests.support.waiting import eventually

CONTRACT = Contract(session_class="C1", quality_floor=1, determinism="T1", period_ms=1000.0)
SOURCES = '[backend_sources]\nslow_avatar = "tests.recovery.slow_backend:SlowAvatar"\n'


def lone_block_ms(stack, host_id: str) -> float:
    """The host's heartbeat as placement reads it: its floor row's block price (what `period` compares)."""
    entry = stack.placements[0].liveness.entry(host_id)
    rows = [r for r in entry.profile if r.backend == "slow_avatar" and r.tier >= 1] if entry else []
    return min(rows, key=lambda r: r.tier).block_ms if rows else 0.0


@pytest.mark.timeout(300)
async def test_an_idle_host_that_learned_a_price_above_the_period_takes_a_session_again(stack, tmp_path):
    config = tmp_path / "slow_avatar.toml"
    config.write_text(SOURCES)
    slow = tmp_path / "e0.slow"  # absent (0) while e0 profiles itself
    await stack.start()
    await stack.engines_up("e0", config=config, SF_TEST_STAGE_SLOW_FILE=str(slow))
    await stack.create("a", contract=CONTRACT, backend="slow_avatar")
    slow.write_text("3")  # every block now takes three periods: e0 learns that
    await eventually(lambda: lone_block_ms(stack, "e0") > CONTRACT.period_ms, 120,
                     what="e0's heartbeat prices a block above the period")
    await bus.request(stack.nc, names.FENCE_CLOSE, CloseRequest(session_id="a"), CloseReply)
    slow.write_text("0")

    async def placed_on_e0() -> Placement | None:
        try:
            return await bus.request(stack.nc, names.PLACEMENT_PLACE, PlaceRequest(
                session_id="b", backend="slow_avatar", contract=CONTRACT), Placement)
        except Rejected:  # refused as `period` while the learned price has not relaxed yet
            return None

    placement = await eventually(placed_on_e0, 120, every_s=0.5, what="e0 takes a session again")
    assert placement.host_id == "e0"
