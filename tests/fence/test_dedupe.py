"""Resent items with a client id are answered with the first copy's seq and stored once, whichever
ingress instance gets the resend, across a restart, and inside one burst."""

from __future__ import annotations

import asyncio
import json
import random

from libs.fence import ownership
from tests.support.fence import burst, engine, post, register, start_fence, stored_items
from tests.support.waiting import eventually


def item(text: str, item_id: str | None) -> dict:
    return {"kind": "text", "data": text, **({"id": item_id} if item_id else {})}


async def test_a_resend_is_answered_with_the_first_seq_and_stored_once(nats_server, nc, http):
    js = nc.jetstream()
    fence = await start_fence(nats_server.url, "fence-d")
    try:
        token = await register(nc, "d1")
        eng = await engine(nc, "E")
        await eng.adopt("d1", (await ownership.assign(nc, "d1", "E")).version)
        assert await post(http, fence, "d1", token, item("a", "id-a")) == (200, {"session_id": "d1", "seq": 1})
        assert await post(http, fence, "d1", token, item("a", "id-a")) == \
            (200, {"session_id": "d1", "seq": 1, "duplicate": True})
        assert (await post(http, fence, "d1", token, item("b", None)))[1]["seq"] == 2
        assert (await post(http, fence, "d1", token, item("b", None)))[1]["seq"] == 3  # no id: stored again
        for bad in ("", "x" * 129, 7):
            status, problem = await post(http, fence, "d1", token, {"kind": "text", "data": "c", "id": bad})
            assert (status, problem["code"]) == (400, "schema")
        # a burst that repeats an id inside itself, and ids from before
        frames = [json.dumps(item(t, i)) for t, i in [("c", "id-c"), ("c", "id-c"), ("a", "id-a"), ("d", "id-d")]]
        answers = await burst(http, fence, "d1", token, frames)
        assert answers == [{"seq": 4}, {"seq": 4, "duplicate": True}, {"seq": 1, "duplicate": True}, {"seq": 5}]
        await fence.stop()
        fence = await start_fence(nats_server.url, "fence-d2")  # a restarted instance learns the ids again
        assert (await post(http, fence, "d1", token, item("d", "id-d")))[1] == \
            {"session_id": "d1", "seq": 5, "duplicate": True}
        assert [i.seq for i in await stored_items(js, "d1")] == [1, 2, 3, 4, 5]
        await eventually(lambda: eng.state["d1"] == [1, 2, 3, 4, 5])
        await eng.stop()
    finally:
        await fence.stop()


async def test_resends_racing_through_two_instances_are_stored_once(nats_server, nc, http):
    """Every item goes to both instances at once, as a client that timed out on one and resent to
    the other; their stores conflict, and the loser must find the winner's copy before numbering."""
    rng = random.Random(3)
    js = nc.jetstream()
    fences = [await start_fence(nats_server.url, f"fence-{i}") for i in range(2)]
    try:
        token = await register(nc, "d2")
        ids = [f"i{n}" for n in range(200)]
        orders = [ids[:], ids[:]]
        for o in orders:  # each copy of the stream sees the ids in a slightly different order
            for _ in range(40):
                a, b = rng.randrange(len(o)), rng.randrange(len(o))
                o[a], o[b] = o[b], o[a]
        answers = await asyncio.gather(*(burst(http, f, "d2", token, [json.dumps(item(i, i)) for i in o])
                                         for f, o in zip(fences, orders, strict=True)))
        seq_of = [{i: a["seq"] for i, a in zip(o, ans, strict=True)} for o, ans in zip(orders, answers, strict=True)]
        assert seq_of[0] == seq_of[1]  # both copies of an item were answered with one seq
        stored = await stored_items(js, "d2")
        assert [i.seq for i in stored] == list(range(1, len(ids) + 1))  # each id stored exactly once
        assert {json.loads(i.data): i.seq for i in stored} == seq_of[0]
        assert sum(a.get("duplicate", False) for ans in answers for a in ans) == len(ids)
    finally:
        for f in fences:
            await f.stop()
