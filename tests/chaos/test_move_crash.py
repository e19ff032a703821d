"""The mover and placement are SIGKILLed in the middle of a live move. `statefleet up` restarts
both; the restarted mover closes the journalled move out (rollback, or finishing a hand-over the
destination already committed), the session keeps one owner throughout, and placement places new
sessions again."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time

import pytest

from bench.frontend import c1_contract, open_session
from libs import bus, names
from libs.fence.ownership import read_owner
from libs.schemas.motion import MoveReceipt, MoveRequest
from tests.support.chaos import assert_clean, record

pytestmark = pytest.mark.chaos


async def test_mover_and_placement_killed_mid_move(drill, chaos_results):
    # The fleet controller's own rebalancing is off here: the drill asserts which host owns the session
    # once its move is closed out (dest if committed, source if rolled back), and a rebalancing move after
    # that would change the owner for reasons of its own (the controller still runs: idle offload, failover)
    d = await drill(engines=2, SF_REBALANCE="false")
    clients = await d.open(3)
    moving = clients[0]
    receipts: list[MoveReceipt] = []  # this drill's move only: the controller's own moves publish here too
    move_id = ""

    async def on_receipt(r: MoveReceipt) -> None:
        if r.move_id == move_id:
            receipts.append(r)

    await bus.subscribe_events(d.nc, names.move_receipt_subject(moving.sid), MoveReceipt, on_receipt)
    journal = await d.nc.jetstream().key_value(names.MOVES_INFLIGHT_BUCKET)
    js = d.nc.jetstream()
    # The fleet controller rebalances beside the drill, so the session may have moved since it was
    # opened: ask from its owner now, and ask again if the controller moved it in between (the mover
    # refuses a move from a host that no longer owns the session before journalling anything).
    for attempt in range(5):
        owner = (await read_owner(js, moving.sid)).view.owner
        assert owner is not None, "the session has no owner"
        source = owner.server_id
        dest = next(h for h in d.stack.host_ids if h != source)
        move_id = f"chaos-move-{attempt}"
        req = MoveRequest(session_id=moving.sid, source=source, dest=dest, deadline_s=10.0, move_id=move_id)
        asked = asyncio.create_task(bus.request(d.nc, names.MOVER_MOVE, req, MoveReceipt, timeout_s=30))
        deadline = time.monotonic() + 30
        journalled = False
        while not journalled and not asked.done():  # journalled before it touches either host: kill then
            with contextlib.suppress(Exception):
                journalled = move_id in await journal.keys()
            assert time.monotonic() < deadline, "the move was never journalled"
            await asyncio.sleep(0.005)
        if journalled:
            break
        refused = asked.result()
        assert refused.outcome == "rejected" and "does not own" in refused.reason, \
            f"the move ended before it was journalled: {refused}"
    else:
        raise AssertionError("the session kept moving under the drill")
    d.stack.signal("mover", signal.SIGKILL)
    d.stack.signal("placement", signal.SIGKILL)
    at = d.fault("SIGKILL mover and placement mid-move")
    with contextlib.suppress(Exception):  # its coordinator died: no answer comes
        await asked
    await d.recovered(at)
    for _ in range(600):
        if receipts:
            break
        await asyncio.sleep(0.1)
    assert receipts, "the restarted mover never closed the move out"
    # Placement is back: a new session is admitted and placed without anyone restarting anything.
    extra = await open_session(d.nc, d.http, d.stack.admission_url, c1_contract(), seed=99)
    extra.start_input(d.http, 0.1)
    d.clients.append(extra)
    await d.serving()
    audits = await d.finish()
    row = record(chaos_results, "mover_and_placement_sigkill_mid_move", d, audits,
                 move_outcome=receipts[-1].outcome, move_reason=receipts[-1].reason)
    owner = next(a.owner for a in audits if a.session_id == moving.sid)
    assert owner == (dest if receipts[-1].outcome == "committed" else source), row
    assert_clean(row)
