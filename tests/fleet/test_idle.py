"""Idle offload through the placement service: a session with no input for keep-warm is suspended (its
state leaves the device), and new input resumes it with the state it had, bit for bit."""

from __future__ import annotations

from libs.contracts import Contract
from tests.support.fleet import advance, configure, fingerprint
from tests.support.waiting import eventually

BULK = Contract(session_class="C3", quality_floor=1, determinism="T0")  # runs blocks only when advanced


async def test_an_idle_session_suspends_and_resumes_bit_exact_on_new_input(stack):
    await stack.start(fleet_control=True, control_s=0.2, keep_warm_s=1.0, rebalance=False)
    await stack.engines_up("e0")
    host = (await stack.create("idle", contract=BULK)).host_id
    await stack.send("idle", 1, 2)
    await eventually(lambda: _cursor(stack, host, "idle", 2))  # both items pending before any block runs
    await advance(stack, host, "idle", 2)
    before = await fingerprint(stack, host, "idle")

    async def state(sid: str, host_id: str, want: str):
        info = await stack.info(host_id, sid)
        return info if info is not None and info.state == want else None

    await eventually(lambda: state("idle", host, "suspended"), 20)
    assert await fingerprint(stack, host, "idle") == before  # in host memory, unchanged
    await stack.send("idle", 3, 3)  # new input: the controller resumes it; the frontend saw no error
    info = await eventually(lambda: state("idle", host, "running"), 20)
    assert info.input_cursor == 3
    assert await fingerprint(stack, host, "idle") == before
    configure(stack, keep_warm_s=0.0)  # offload off: the reference below never suspends
    ref_host = (await stack.create("ref", contract=BULK)).host_id  # the same session, with the same input, never suspended

    await stack.send("ref", 1, 2)
    await eventually(lambda: _cursor(stack, ref_host, "ref", 2))
    await advance(stack, ref_host, "ref", 2)
    await stack.send("ref", 3, 3)
    for sid, h in (("idle", host), ("ref", ref_host)):
        await eventually(lambda sid=sid, h=h: _cursor(stack, h, sid, 3))
        done = await advance(stack, h, sid, 1)
        assert done.consumed_seq == 3 and done.blocks_done == 3
    assert await fingerprint(stack, host, "idle") == await fingerprint(stack, ref_host, "ref")


async def _cursor(stack, host_id: str, sid: str, n: int):
    info = await stack.info(host_id, sid)
    return info is not None and info.input_cursor == n
