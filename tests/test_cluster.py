"""The same bus code on a 3-node JetStream cluster with replicas = 3, surviving a node loss."""

from __future__ import annotations

import asyncio

import nats.errors
import pytest

from libs import bus

pytestmark = pytest.mark.slow


async def until_answered(op, attempts: int = 100):
    for _ in range(attempts - 1):
        try:
            return await op()
        except nats.errors.Error:
            await asyncio.sleep(0.2)
    return await op()


async def test_replicated_stream_survives_one_node(nats_cluster):
    urls = ",".join(n.url for n in nats_cluster)
    nc = await bus.connect(urls, name="test-cluster")
    try:
        js = nc.jetstream()
        for _ in range(100):  # the cluster elects its meta leader shortly after start
            try:
                await bus.ensure_stream(js, bus.StreamSpec(name="SF_R3", subjects=["sf.r3.>"], replicas=3))
                break
            except Exception:
                await asyncio.sleep(0.2)
        # a stream just created elects its own leader too: until then a publish gets no response (seen in a
        # fresh-clone CI run, 2026-12-08); the msg id makes a retried publish land once
        await until_answered(lambda: js.publish("sf.r3.a", b"before", timeout=2, headers={"Nats-Msg-Id": "before-1"}))
        kv = await bus.ensure_kv(js, "sf_r3_kv", replicas=3)  # R3 assets need all 3 peers to be created
        info = await js.stream_info("SF_R3")
        assert info.config.num_replicas == 3
        nats_cluster[2].kill()
        # Streams whose leader was on the dead node elect a new one and the client may be
        # reconnecting: retry until the cluster answers (the msg id makes a retried publish land once).
        ack = await until_answered(lambda: js.publish("sf.r3.a", b"after", timeout=2,
                                                      headers={"Nats-Msg-Id": "after-1"}))
        assert ack.seq == 2
        await until_answered(lambda: kv.put("k", b"v"))
        assert (await until_answered(lambda: kv.get("k"))).value == b"v"
    finally:
        await nc.close()
