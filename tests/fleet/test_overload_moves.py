"""Overload relief on a real stack (issue 23 item 3), its first two steps: a host whose blocks get dearer while
it serves steps its sessions down their ladders, and what is still past the device's limit then moves live to
another device with room, with every input applied exactly once across the move; nothing is suspended.

The other device is an engine host on another machine: a process in a UTS namespace of its own under another
host name (`EngineProcess(hostname=...)`), so it announces another machine and so another CPU device. The
dearer blocks come from the test backend's switch (`tests/recovery/slow_backend.py`): its denoise stage sleeps
what its file says, so the device's measured load passes the limit whatever the machine's own load."""

from __future__ import annotations

import os

import pytest

from libs.contracts import Contract
from tests.support.invariants import check_log, read_log
from tests.support.waiting import eventually

SOURCES = '[backend_sources]\nslow_avatar = "tests.recovery.slow_backend:SlowAvatar"\n'
# A block every 500 ms; served at its best tier (8) while there is room, its floor is tier 1.
CONTRACT = Contract(session_class="C1", quality_floor=1, determinism="T1", period_ms=500.0)
SIDS = ("a", "b")
# Each block's denoise sleeps 300 ms once the switch is on: 0.6 of the device a session at any tier, so the
# two sessions need 1.2 of e0's device (limit 0.9) even at their floors; one of them fits.
SLOW_S = "0.3"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="another machine needs a UTS namespace (root)")


@pytest.mark.timeout(300)
async def test_a_host_whose_blocks_get_dearer_steps_down_then_moves_a_session_to_another_device(stack, tmp_path):
    config = tmp_path / "slow_avatar.toml"
    config.write_text(SOURCES)
    slow = tmp_path / "e0.slow"  # absent: no stage time added
    await stack.start(fleet_control=True, control_s=0.2, rebalance=False, relieve_overload=True,
                      keep_warm_s=3600.0)
    await stack.engines_up("e0", config=config, SF_TEST_STAGE_SLOW_FILE=str(slow))
    for sid in SIDS:
        assert (await stack.create(sid, contract=CONTRACT, backend="slow_avatar")).host_id == "e0"
    await stack.engines_up("e1", config=config, hostname="statefleet-test-other")
    sent = 0

    async def send_more(n: int = 2) -> None:
        nonlocal sent
        for sid in SIDS:
            await stack.send(sid, sent + 1, sent + n)
        sent += n

    await send_more()
    tiers = {sid: (await eventually(lambda sid=sid: stack.consumed(sid, sent), 60)).tier for sid in SIDS}
    assert all(t > 1 for t in tiers.values()), tiers  # room: both served above their floor

    slow.write_text(SLOW_S)  # every block of e0 now 300 ms dearer

    async def stepped_down() -> bool:
        infos = [await stack.info("e0", sid) for sid in SIDS]
        return any(i is not None and i.tier < tiers[i.session_id] for i in infos)

    await eventually(stepped_down, 60, every_s=0.1, what="e0 steps a session down its ladder")

    async def one_moved() -> str | None:
        await send_more(1)  # input keeps coming while the device is relieved
        for sid in SIDS:
            view = await stack.owner(sid)
            if view is not None and view.owner.server_id == "e1":
                return sid
        return None

    moved = await eventually(one_moved, 120, every_s=0.5, what="a session moved live to the other device")
    view = await stack.owner(moved)
    assert view.owner.version == 2 and view.claim is not None  # one hand-off by the mover: no failover
    await send_more()
    for sid in SIDS:  # every input applied, in order, exactly once, across the move
        await eventually(lambda sid=sid: stack.consumed(sid, sent), 60, what=f"{sid} consumed all {sent} items")
        check_log(await read_log(stack.js, sid))
    for sid in SIDS:  # moved or kept, never suspended nor shed
        info = await stack.info((await stack.owner(sid)).owner.server_id, sid)
        assert info is not None and info.state != "suspended", (sid, info)
