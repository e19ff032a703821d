"""On a real nats-server, what nats-py raises surfaces as our typed outcome (see `libs/bus/__init__.py`):
nothing there is None, a lost compare-and-set is False or `Conflict`, nothing serving a request or a lost
connection is `Unavailable`, no answer in time is `Timeout`; never a nats-py exception."""

from __future__ import annotations

import asyncio

import nats.errors
import pytest

from libs import bus, errors
from libs.fence.session_log import EXPECTED_LAST_SUBJECT_SEQ
from libs.schemas.common import Ping, Pong

STREAM = bus.StreamSpec(name="SF_TEST_FAIL", subjects=["sf.test.fail.>"])


def _ours(e: BaseException) -> None:
    """Raised typed, with nats-py's exception neither raised nor chained."""
    assert isinstance(e, errors.StatefleetError) and not isinstance(e, nats.errors.Error)
    assert e.__cause__ is None and (e.__suppress_context__ or e.__context__ is None)


async def test_a_missing_key_message_bucket_or_object_is_none(nc):
    js = nc.jetstream()
    kv = await bus.ensure_kv(js, "sf_test_fail_kv")
    assert await bus.kv_read(kv, "never") is None
    await kv.put("gone", b"1")
    await kv.delete("gone")
    assert await bus.kv_read(kv, "gone") is None
    await kv.put("purged", b"1")
    await bus.purge_key(kv, "purged", what="a test key")
    assert await bus.kv_read(kv, "purged") is None
    assert await bus.bucket(js, "sf_test_never_made") is None

    await bus.ensure_stream(js, STREAM)
    assert await bus.last_msg(js, STREAM.name, "sf.test.fail.empty", what="a test subject") is None
    assert await bus.next_msg(js, STREAM.name, "sf.test.fail.empty", 1, what="a test subject") is None
    store = await bus.ensure_object_store(js, "sf_test_fail_obj")
    assert await bus.read_object(store, "never", what="a test object") is None


async def test_a_compare_and_set_at_a_stale_revision_loses(nc):
    js = nc.jetstream()
    kv = await bus.ensure_kv(js, "sf_test_fail_cas")
    assert await bus.kv_swap(kv, "k", b"1", 0)  # created
    assert not await bus.kv_swap(kv, "k", b"2", 0)  # it exists now: not created again
    revision = (await bus.kv_read(kv, "k")).revision
    assert await bus.kv_swap(kv, "k", b"2", revision)
    assert not await bus.kv_swap(kv, "k", b"3", revision)  # another write came first
    assert (await bus.kv_read(kv, "k")).value == b"2"


async def test_an_append_whose_expected_last_sequence_moved_is_a_conflict(nc):
    js = nc.jetstream()
    await bus.ensure_stream(js, STREAM)
    subject = "sf.test.fail.log"
    seq = await bus.append(js, subject, b"a", {EXPECTED_LAST_SUBJECT_SEQ: "0"}, what="a test log")
    await bus.append(js, subject, b"b", {EXPECTED_LAST_SUBJECT_SEQ: str(seq)}, what="a test log")
    with pytest.raises(errors.Conflict) as e:
        await bus.append(js, subject, b"c", {EXPECTED_LAST_SUBJECT_SEQ: str(seq)}, what="a test log", k="v")
    _ours(e.value)
    assert e.value.k == "v"
    assert (await bus.last_msg(js, STREAM.name, subject, what="a test log")).data == b"b"  # nothing appended


async def test_a_request_nothing_serves_is_unavailable(nc):
    with pytest.raises(errors.Unavailable) as e:
        await bus.request(nc, "sf.test.fail.nobody", Ping(), Pong, timeout_s=2)
    _ours(e.value)
    assert e.value.retryable and e.value.subject == "sf.test.fail.nobody"


async def test_a_request_unanswered_in_time_is_a_timeout(nc):
    answered = asyncio.Event()

    async def never(_: Ping) -> Pong:
        await answered.wait()
        raise AssertionError("never answers")

    await bus.serve(nc, "sf.test.fail.slow", Ping, never)
    with pytest.raises(errors.Timeout) as e:
        await bus.request(nc, "sf.test.fail.slow", Ping(), Pong, timeout_s=0.2)
    _ours(e.value)
    answered.set()


async def test_a_watch_with_no_update_in_time_is_a_timeout(nc):
    kv = await bus.ensure_kv(nc.jetstream(), "sf_test_fail_watch")
    watcher = await bus.watch(kv)
    assert await bus.next_update(watcher, 5) is None  # caught up: the bucket is empty
    with pytest.raises(errors.Timeout):
        await bus.next_update(watcher, 0.1)
    await bus.quietly(watcher.stop())


async def test_calls_on_a_closed_connection_are_unavailable(nats_server):
    nc = await bus.connect(nats_server.url, name="test-closed")
    js = nc.jetstream()
    kv = await bus.ensure_kv(js, "sf_test_fail_closed")
    await nc.close()
    for call in (bus.kv_read(kv, "k"), bus.kv_swap(kv, "k", b"1", 0), bus.publish(nc, "sf.test.fail.x", b"1"),
                 bus.request(nc, "sf.test.fail.x", Ping(), Pong, timeout_s=1)):
        with pytest.raises(errors.Unavailable) as e:
            await call
        _ours(e.value)
    with pytest.raises(errors.Unavailable), bus.unavailable("a raw nats-py call"):
        await nc.publish("sf.test.fail.x", b"1")
    assert isinstance(bus.typed_error(nats.errors.ConnectionClosedError()), errors.Unavailable)


async def test_a_stream_the_server_refuses_is_unavailable_not_nats_pys_error(nc):
    """A single server refuses three replicas: provisioning says so in our terms, the reason kept."""
    with pytest.raises(errors.Unavailable) as e:
        await bus.ensure_stream(nc.jetstream(), bus.StreamSpec(name="SF_TEST_R3", subjects=["sf.test.r3.>"],
                                                               replicas=3))
    _ours(e.value)
    assert "SF_TEST_R3" in e.value.detail
