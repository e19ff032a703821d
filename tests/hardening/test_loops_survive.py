"""The loops that own work survive a malformed message or a timeout: log it, count it, go on.

Fence's gateway consumer, fed junk on the input stream, still releases what comes after it; an
engine's assignment watcher, whose log read times out or whose notice is malformed, still claims
what is assigned next."""

from __future__ import annotations

import asyncio
import time

from libs import errors, names
from libs.fence import session_log
from libs.fence.ownership import assign
from libs.schemas.base import encode
from libs.schemas.common import InputItem
from libs.schemas.fence import AssignNotice, InputBatch
from services.fence.gateway import CONSUMER
from tests.support.fence import engine, fence, register  # noqa: F401
from tests.support.waiting import eventually


async def test_the_gateway_consumer_skips_junk_and_releases_what_follows(nats_server, nc, fence):  # noqa: F811
    js = nc.jetstream()
    await register(nc, "g1")
    toy = await engine(nc, "e1")
    try:
        await assign(nc, "g1", "e1")
        await toy.adopt("g1", 1)
        # junk only a bus client could store: undecodable bytes, an empty batch, a batch naming another session
        await js.publish(names.input_subject("g1"), b"\xff\x00not msgpack")
        await js.publish(names.input_subject("g1"), encode(InputBatch(session_id="g1", items=[])))
        await js.publish(names.input_subject("g1"), encode(InputBatch(session_id="other", items=[
            InputItem(session_id="other", seq=1, kind="text", data=b'"x"')])))
        await wait_for_consumer(js)  # the junk fetched and handled on its own
        # a valid batch that only the consumer sees (no ingress offered it)
        await js.publish(names.input_subject("g1"), encode(InputBatch(session_id="g1", items=[
            InputItem(session_id="g1", seq=1, kind="text", data=b'"hello"', accepted_at=time.time())])))
        await eventually(lambda: toy.state.get("g1") == [1])
        assert not fence.gateway._task.done()
    finally:
        await toy.stop()


async def wait_for_consumer(js) -> None:
    for _ in range(200):
        info = await js.consumer_info(names.INPUT_STREAM, CONSUMER)
        if info.num_pending == 0 and info.num_ack_pending == 0:
            return
        await asyncio.sleep(0.02)
    raise AssertionError("the gateway consumer never caught up")


async def test_the_assignment_watcher_survives_a_timeout_and_a_malformed_notice(nats_server, nc, fence,  # noqa: F811
                                                                             monkeypatch):
    await register(nc, "w1")
    toy = await engine(nc, "e2")
    real_read_tail = session_log.read_tail
    timeouts: list[str] = []
    armed = False

    async def flaky_read_tail(js_, session_id):
        if armed and not timeouts:
            timeouts.append(session_id)
            raise errors.Timeout("reading the session log timed out", session_id=session_id)
        return await real_read_tail(js_, session_id)

    monkeypatch.setattr(session_log, "read_tail", flaky_read_tail)
    try:
        # a notice with an id that is no session id, straight onto the host's subject
        bad = AssignNotice(session_id="x\ny", server_id="e2", version=1, log_seq=1)
        await nc.publish(names.assigned_subject("e2"), encode(bad))
        await nc.publish(names.assigned_subject("e2"), b"\x00garbage")
        await assign(nc, "w1", "e2")
        armed = True  # the watcher's first log read times out: retried, not fatal
        notice = await toy.client.next_assignment()
        assert (notice.session_id, notice.version) == ("w1", 1)
        assert timeouts == ["w1"]
    finally:
        await toy.stop()
