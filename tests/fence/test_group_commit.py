"""Group commit of input items on a real nats-server.

Invariants: every acknowledged item is stored exactly once, with a gap-free seq; one connection's
items get rising seqs in the order it sent them; answers come back in frame order; a stored
message is a whole group (nothing half-written when a writer is stopped mid-store); and readers
find every item whatever the grouping.
"""

from __future__ import annotations

import asyncio
import json
import random

import pytest

from libs import errors, names
from libs.fence import ownership, session_log
from libs.schemas.base import encode
from libs.schemas.common import InputItem
from libs.schemas.fence import InputBatch
from services.fence.input_reads import read_items
from services.fence.inputs import InputAppender, Stored
from tests.support.fence import (
    burst,
    engine,
    frame,
    register,
    start_fence,
    stored_batches,
    stored_items,
)
from tests.support.waiting import eventually


async def test_a_burst_shares_stores_and_is_answered_in_frame_order(fence, nc, http):
    js = nc.jetstream()
    token = await register(nc, "g1")
    eng = await engine(nc, "E")
    await eng.adopt("g1", (await ownership.assign(nc, "g1", "E")).version)
    frames = [frame(f"t{i}") if i % 50 != 7 else "garbage" for i in range(300)]
    answers = await burst(http, fence, "g1", token, frames)
    good = [f for f in frames if f != "garbage"]
    assert [a.get("seq") for a in answers if "seq" in a] == list(range(1, len(good) + 1))
    assert [i for i, a in enumerate(answers) if "error" in a] == [i for i, f in enumerate(frames) if f == "garbage"]
    assert all(a["error"]["code"] == "schema" for a in answers if "error" in a)
    items = await stored_items(js, "g1")
    assert [i.seq for i in items] == list(range(1, len(good) + 1))
    assert [json.loads(i.data) for i in items] == [json.loads(f)["data"] for f in good]
    assert await stored_batches(js, "g1") < len(good)  # items that waited went out together
    await eventually(lambda: eng.state["g1"] == list(range(1, len(good) + 1)))
    await eng.stop()


async def test_two_instances_storing_one_session_never_share_a_seq(nats_server, nc, http):
    """Both ingress instances group-commit the same session at once: their compare-and-set stores
    conflict, and each loser re-reads the tail and takes the seqs after the winner's."""
    js = nc.jetstream()
    fences = [await start_fence(nats_server.url, f"fence-{i}") for i in range(2)]
    try:
        token = await register(nc, "g2")
        eng = await engine(nc, "E")
        await eng.adopt("g2", (await ownership.assign(nc, "g2", "E")).version)
        sent = {c: [frame(f"{c}{i}") for i in range(150)] for c in ("a", "b", "c", "d")}
        conns = list(sent)
        answers = await asyncio.gather(*(burst(http, fences[k % 2], "g2", token, sent[c])
                                         for k, c in enumerate(conns)))
        seqs = {c: [a["seq"] for a in ans] for c, ans in zip(conns, answers, strict=True)}
        every = sorted(s for v in seqs.values() for s in v)
        assert every == list(range(1, 601))
        items = {i.seq: json.loads(i.data) for i in await stored_items(js, "g2")}
        assert sorted(items) == every
        for c in conns:  # each connection's items rise in the order it sent them
            assert seqs[c] == sorted(seqs[c])
            assert [items[s] for s in seqs[c]] == [json.loads(f)["data"] for f in sent[c]]
        await eventually(lambda: eng.state["g2"] == list(range(1, 601)), 20)
        await eng.stop()
    finally:
        for f in fences:
            await f.stop()


async def test_the_bound_counts_queued_items_and_nothing_is_lost(nats_server, nc, http):
    fence = await start_fence(nats_server.url, "fence-q", max_pending_items=5)
    try:
        token = await register(nc, "g3")
        a = await ownership.assign(nc, "g3", "e1")  # assigned, not claimed: items wait
        answers = await burst(http, fence, "g3", token, [frame(str(i)) for i in range(20)])
        assert [x.get("seq") for x in answers[:5]] == [1, 2, 3, 4, 5]
        assert all(x["error"]["code"] == "busy" for x in answers[5:])
        eng = await engine(nc, "e1")
        await eng.adopt("g3", a.version)
        await eventually(lambda: eng.state["g3"] == [1, 2, 3, 4, 5])
        await eng.stop()
    finally:
        await fence.stop()


async def test_a_writer_stopped_mid_store_leaves_whole_groups_only(nats_server, nc):
    js = nc.jetstream()
    await session_log.provision(js)
    for trial in range(5):
        sid = f"g4-{trial}"
        appender = InputAppender(js, max_group_items=16, max_group_bytes=1 << 20)
        futures = [appender.submit(sid, "text", f'"{i}"'.encode(), 0.0) for i in range(400)]
        await asyncio.sleep(0.002 * trial)
        await appender.close()
        done = await asyncio.gather(*futures, return_exceptions=True)
        acked = [r for r in done if isinstance(r, Stored)]
        failed = [r for r in done if not isinstance(r, Stored)]
        assert all(isinstance(e, errors.Unavailable) for e in failed)
        assert [r.seq for r in acked] == list(range(1, len(acked) + 1))  # acks are a prefix
        items = await stored_items(js, sid)
        # a store cancelled after it was sent may still land, but only whole and after every acked one
        assert [i.seq for i in items] == list(range(1, len(items) + 1))
        assert len(items) >= len(acked)
        assert [i.data for i in items] == [f'"{n}"'.encode() for n in range(len(items))]
        # a fresh appender carries on after whatever landed
        nxt = await InputAppender(js, max_group_items=16, max_group_bytes=1 << 20).append(sid, "text", b'"x"', 0.0)
        assert nxt.seq == len(items) + 1


@pytest.mark.parametrize("seed", range(3))
async def test_readers_find_every_item_whatever_the_grouping(nats_server, nc, seed):
    """Random group sizes, interleaved with another session's stores: `read_items` from any cursor,
    with or without the stream position a release recorded, returns the next items in order."""
    rng = random.Random(seed)
    js = nc.jetstream()
    await session_log.provision(js)
    sid, other = f"g5-{seed}", f"g5x-{seed}"
    n, positions = 0, {}  # item seq -> stream seq of its batch
    while n < 200:
        size = rng.choice([1, 1, 2, 3, 8, 17])
        items = [InputItem(session_id=sid, seq=n + k + 1, kind="text", data=b'"a"') for k in range(size)]
        ack = await js.publish(names.input_subject(sid), encode(InputBatch(session_id=sid, items=items)))
        positions.update({i.seq: ack.seq for i in items})
        n += size
        if rng.random() < 0.5:
            await js.publish(names.input_subject(other),
                             encode(InputBatch(session_id=other, items=[InputItem(session_id=other, seq=n, kind="text",
                                                                                  data=b'"b"')])))
    for _ in range(60):
        after = rng.randrange(0, n + 1)
        pos = positions.get(after, 0) if rng.random() < 0.5 else 0
        limit = rng.choice([1, 5, 64, 1000])
        got = await read_items(js, sid, after, pos, max_items=limit, max_bytes=1 << 20)
        assert [i.seq for i, _ in got] == list(range(after + 1, min(n, after + limit) + 1))
        assert all(p == positions[i.seq] for i, p in got)


async def test_items_stored_by_an_instance_that_died_before_releasing_reach_the_owner(fence, nc):
    """The offer path is a shortcut; the shared consumer is the net. Items stored by an appender that
    never offers them (its instance died right after the store) are released by the running fence."""
    js = nc.jetstream()
    await register(nc, "g6")
    eng = await engine(nc, "E")
    await eng.adopt("g6", (await ownership.assign(nc, "g6", "E")).version)
    dead = InputAppender(js, max_group_items=8, max_group_bytes=1 << 20)  # on_stored=None: nobody offers
    stored = await asyncio.gather(*(dead.append("g6", "text", f'"{i}"'.encode(), 0.0) for i in range(30)))
    assert sorted(s.seq for s in stored) == list(range(1, 31))
    await eventually(lambda: eng.state["g6"] == list(range(1, 31)), 15)
    await eng.stop()


async def test_a_backlog_larger_than_the_consumers_batch_reaches_the_owner_in_order(nats_server, nc):
    """The net fetches a full batch again at once (only a partial fetch pauses): items a dead instance
    stored, many more than one fetch holds, all reach the owner, each once and in seq order."""
    fence = await start_fence(nats_server.url, "fence-b", gateway_batch=4)
    try:
        js = nc.jetstream()
        await register(nc, "g7")
        eng = await engine(nc, "E")
        await eng.adopt("g7", (await ownership.assign(nc, "g7", "E")).version)
        dead = InputAppender(js, max_group_items=1, max_group_bytes=1 << 20)  # one item per stored message
        for i in range(40):
            await dead.append("g7", "text", f'"{i}"'.encode(), 0.0)
        await eventually(lambda: eng.state["g7"] == list(range(1, 41)), 15)
        await eng.stop()
    finally:
        await fence.stop()
