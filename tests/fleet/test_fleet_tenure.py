"""The fleet controller's tenure: one holder at a time by compare-and-set, taken over once it expires."""

from __future__ import annotations

import asyncio

from libs import bus, names
from services.placement.tenure import KvTenure


async def tenures(nc, n: int, ttl_s: float) -> list[KvTenure]:
    kv = await bus.ensure_kv(nc.jetstream(), names.PLACEMENT_TENURE_BUCKET)
    return [KvTenure(kv, "fleet", f"placement-{i}", ttl_s=ttl_s, margin_s=ttl_s / 3) for i in range(n)]


async def test_of_racing_instances_exactly_one_holds_and_renewing_keeps_it(nc):
    many = await tenures(nc, 4, ttl_s=2.0)
    won = await asyncio.gather(*(t.renew() for t in many))
    assert sum(won) == 1
    holder = many[won.index(True)]
    for _ in range(3):  # the holder renews; nobody else gets in while it does
        assert await holder.renew()
        assert not any(await asyncio.gather(*(t.renew() for t in many if t is not holder)))
    assert [t.held for t in many] == won


async def test_an_expired_tenure_is_taken_over_and_the_old_holder_stops_acting(nc):
    a, b = await tenures(nc, 2, ttl_s=0.6)
    assert await a.renew() and not await b.renew()
    await asyncio.sleep(0.45)  # a has not renewed: it stops counting itself the holder before the tenure ends
    assert not a.held
    await asyncio.sleep(0.3)
    assert await b.renew() and b.held
    assert not await a.renew() and not a.held  # the old holder's renewal is refused


async def test_a_holder_that_gives_up_hands_over_at_once(nc):
    a, b = await tenures(nc, 2, ttl_s=30.0)
    assert await a.renew()
    await a.give_up()
    assert not a.held and await b.renew()
