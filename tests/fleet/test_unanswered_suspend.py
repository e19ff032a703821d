"""A shed suspend whose reply comes after the fleet controller's request timed out, on a real stack
(nats-server, fence, placement, an engine-host process): the host suspends the session at its next block
boundary, after the controller gave up on the request, and the session ends up marked shed all the same.

Before, the controller recorded nothing for a suspend that timed out, so the session sat suspended on its
host with no mark: `statefleet status` and its client never heard why (`bench.failover --hog 2`, 2026-12-03).
The block is held in its stage by the test backend (`tests/recovery/slow_backend.py`, its hold file) rather
than slowed by a guess at how long it must take, so the request times out whatever the machine's load."""

from __future__ import annotations

import pytest

from libs.contracts import Contract
from libs.errors import Timeout
from services.placement.policy import Suspend
from tests.support.waiting import eventually

CONTRACT = Contract(session_class="C1", quality_floor=1, determinism="T1", period_ms=1000.0)
SOURCES = '[backend_sources]\nslow_avatar = "tests.recovery.slow_backend:SlowAvatar"\n'


@pytest.mark.timeout(300)
async def test_a_shed_suspend_the_host_did_after_the_request_timed_out_leaves_the_session_marked(stack, tmp_path):
    config = tmp_path / "slow_avatar.toml"
    config.write_text(SOURCES)
    slow = tmp_path / "e0.slow"  # absent: no stage time added, and no block held until `.hold` is there
    # The controller runs its rounds but decides nothing for the one session itself: one host (nothing to
    # rebalance), no overload relief, no idle suspend within the test.
    await stack.start(placements=1, fleet_control=True, rebalance=False, relieve_overload=False, keep_warm_s=3600.0)
    # The host's own verb limit well past the test, so it never gives up on the suspend itself.
    await stack.engines_up("e0", config=config, SF_TEST_STAGE_SLOW_FILE=str(slow), SF_VERB_TIMEOUT_S="600")
    await stack.create("a", contract=CONTRACT, backend="slow_avatar")
    placement = stack.placements[0]
    fleet = placement.fleet
    await eventually(lambda: fleet.tenure.held, 60, what="the fleet controller's tenure")

    hold = slow.with_name(slow.name + ".hold")
    hold.touch()  # the next block of `a` stays in its stage until the test lets it go
    await eventually(lambda: slow.with_name(slow.name + ".held").exists(), 60, what="a block held in e0's stage")
    # Shed as overload relief sheds a session ("overload": it waits for input, where a `capacity_lost` one
    # would be re-queued and resumed by the next round, its mark gone before the test could read it).
    with pytest.raises(Timeout):  # the host waits for the block boundary; the request gives up first
        await fleet.actions.suspend(Suspend(session_id="a", host_id="e0", reason="overload"))
    info = await stack.info("e0", "a")
    assert info is not None and info.state == "running", info  # not yet: its block is still in the stage
    assert not (s := placement.view.summaries()["a"]).shed, s

    hold.unlink()  # the block ends, and the host carries out the suspend it was asked for

    async def suspended_on_e0() -> bool:
        got = await stack.info("e0", "a")
        return got is not None and got.state == "suspended"

    await eventually(suspended_on_e0, 60, what="a suspended on e0")
    summary = await eventually(lambda: (s := placement.view.summaries().get("a")) and s.shed and s, 60,
                               what="a's summary marked shed")
    assert summary.shed == "overload" and summary.state == "suspended", summary
    assert "e0's device measured past its limit" in summary.reason, summary
