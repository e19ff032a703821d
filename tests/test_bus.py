"""Request/reply error mapping, event dropping and idempotent provisioning on a real nats-server."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from libs import bus, errors
from libs.schemas.base import Msg, encode
from libs.schemas.common import Ping, Pong


class Echo(Msg):
    text: str


async def echo(req: Echo) -> Echo:
    if req.text == "missing":
        raise errors.NotFound("no such session", session_id="s-1")
    if req.text == "boom":
        raise RuntimeError("secret internal detail")
    return Echo(text=req.text.upper())


async def test_reply_decodes_into_the_reply_type(nc):
    await bus.serve(nc, "sf.test.echo", Echo, echo)
    assert await bus.request(nc, "sf.test.echo", Echo(text="hi"), Echo) == Echo(text="HI")


async def test_concurrent_serving_never_queues_a_request_behind_a_slow_one(nc):
    """With concurrency > 1 every request is answered while another is still being handled, and at
    most `concurrency` run at once (past that the subscription waits for a free slot)."""
    release = asyncio.Event()
    running, peak = 0, 0

    async def handler(req: Echo) -> Echo:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        try:
            if req.text == "slow":
                await release.wait()
            return Echo(text=req.text)
        finally:
            running -= 1

    await bus.serve(nc, "sf.test.conc", Echo, handler, concurrency=3)
    slow = [asyncio.create_task(bus.request(nc, "sf.test.conc", Echo(text="slow"), Echo, timeout_s=10))
            for _ in range(2)]
    await asyncio.sleep(0.1)
    for i in range(20):  # one slot stays free for these, every time
        assert (await bus.request(nc, "sf.test.conc", Echo(text=f"f{i}"), Echo, timeout_s=2)).text == f"f{i}"
    release.set()
    assert [(await t).text for t in slow] == ["slow", "slow"]
    assert peak == 3


async def test_typed_error_is_raised_again_on_the_callers_side(nc):
    await bus.serve(nc, "sf.test.echo", Echo, echo)
    with pytest.raises(errors.NotFound) as e:
        await bus.request(nc, "sf.test.echo", Echo(text="missing"), Echo)
    assert e.value.session_id == "s-1"
    assert isinstance(e.value, LookupError)


async def test_unexpected_exception_becomes_internal_without_its_details(nc):
    await bus.serve(nc, "sf.test.echo", Echo, echo)
    with pytest.raises(errors.Internal) as e:
        await bus.request(nc, "sf.test.echo", Echo(text="boom"), Echo)
    assert "secret" not in str(e.value) and e.value.error_id
    # the service keeps answering
    assert await bus.request(nc, "sf.test.echo", Echo(text="ok"), Echo) == Echo(text="OK")


async def test_malformed_request_gets_a_schema_error_reply(nc):
    await bus.serve(nc, "sf.test.echo", Echo, echo)
    resp = await nc.request("sf.test.echo", b"\xc1garbage", timeout=2)
    assert resp.headers[bus.ERROR_HEADER] == "schema"
    with pytest.raises(errors.SchemaError):
        await bus.request(nc, "sf.test.echo", Ping(), Echo)  # a Ping lacks `text`


async def test_unknown_version_gets_a_typed_reply(nc):
    await bus.serve(nc, "sf.test.echo", Echo, echo)
    with pytest.raises(errors.UnsupportedVersion):
        await bus.request(nc, "sf.test.echo", Echo(v=9, text="x"), Echo)


async def test_no_responders_and_timeout_are_typed(nc):
    with pytest.raises(errors.Unavailable):
        await bus.request(nc, "sf.test.nobody", Ping(), Pong, timeout_s=1)

    async def slow(_: Ping) -> Pong:
        await asyncio.sleep(2)
        return Pong(service="s", instance="i", version="v", uptime_s=0)

    await bus.serve(nc, "sf.test.slow", Ping, slow)
    with pytest.raises(errors.Timeout) as e:
        await bus.request(nc, "sf.test.slow", Ping(), Pong, timeout_s=0.2)
    assert isinstance(e.value, TimeoutError)


async def test_malformed_events_are_dropped_and_the_subscriber_continues(nc):
    got: list[Echo] = []

    async def on_event(ev: Echo) -> None:
        got.append(ev)

    await bus.subscribe_events(nc, "sf.test.events", Echo, on_event)
    await nc.publish("sf.test.events", b"not msgpack \xc1")
    await nc.publish("sf.test.events", msgspec.msgpack.encode({"v": 1}))
    await nc.publish("sf.test.events", encode(Echo(text="good")))
    await nc.flush()
    for _ in range(50):
        if got:
            break
        await asyncio.sleep(0.02)
    assert got == [Echo(text="good")]


async def test_provisioning_twice_is_idempotent(nc):
    js = nc.jetstream()
    spec = bus.StreamSpec(name="SF_TEST", subjects=["sf.test.log.>"])
    first = await bus.ensure_stream(js, spec)
    await js.publish("sf.test.log.a", b"1")
    second = await bus.ensure_stream(js, spec)
    assert first.config.name == second.config.name
    assert (await js.stream_info("SF_TEST")).state.messages == 1  # nothing was recreated

    kv1 = await bus.ensure_kv(js, "sf_test_kv", ttl_s=30)
    await kv1.put("k", b"v")
    kv2 = await bus.ensure_kv(js, "sf_test_kv", ttl_s=30)
    assert (await kv2.get("k")).value == b"v"
    kv3 = await bus.ensure_kv(js, "sf_test_kv", ttl_s=60)  # other settings: opened, not wiped
    assert (await kv3.get("k")).value == b"v"

    obj1 = await bus.ensure_object_store(js, "sf_test_obj")
    await obj1.put("blob", b"x" * 1000)
    obj2 = await bus.ensure_object_store(js, "sf_test_obj")
    assert (await obj2.get("blob")).data == b"x" * 1000


async def test_stream_spec_change_updates_the_existing_stream(nc):
    js = nc.jetstream()
    await bus.ensure_stream(js, bus.StreamSpec(name="SF_TEST2", subjects=["sf.t2.>"]))
    info = await bus.ensure_stream(js, bus.StreamSpec(name="SF_TEST2", subjects=["sf.t2.>", "sf.t3.>"]))
    assert set(info.config.subjects) == {"sf.t2.>", "sf.t3.>"}


async def test_a_bucket_listing_sees_every_key_while_one_is_rewritten(nc):
    """Heartbeats rewrite their keys every second while placement lists the bucket: a listing must still
    hold every live key, and never a deleted one. nats-py's `KeyValue.keys()` got 20 of 413 such
    listings wrong (a key left out, or NoKeysError for a bucket with keys)."""
    js = nc.jetstream()
    kv = await bus.ensure_kv(js, "sf_test_listing")
    for key in ("a", "b", "c", "gone"):
        await kv.put(key, b"1")
    await kv.delete("gone")
    stop = asyncio.Event()

    async def rewrite() -> None:
        i = 0
        while not stop.is_set():
            await kv.put("b", str(i).encode())
            i += 1

    writer = asyncio.create_task(rewrite())
    try:
        for _ in range(150):
            assert [e.key for e in await bus.kv_entries(kv)] == ["a", "b", "c"]
            await asyncio.sleep(0.005)
    finally:
        stop.set()
        await writer
    await kv.purge("a")
    assert [e.key for e in await bus.kv_entries(kv)] == ["b", "c"]
