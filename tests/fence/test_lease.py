"""The engine's lease takes exactly the releases addressed to its own `(server_id, version)`.

Records here are written straight into the session log, past fence's decisions, so the
lease's own filter is what is tested: the log is the only thing an engine trusts.
"""

from __future__ import annotations

import asyncio

import pytest

from libs import bus, names
from libs.fence import ownership, session_log
from libs.fence.client import EngineClient
from libs.schemas.common import InputItem
from libs.schemas.fence import Release

SID = "lease-1"


def item(seq: int, text: str) -> InputItem:
    return InputItem(session_id=SID, seq=seq, kind="text", data=f'"{text}"'.encode())


async def write(js, release: Release) -> None:
    await session_log.append(js, SID, await session_log.read_tail(js, SID), release)


@pytest.mark.parametrize("offset", [-1, +1], ids=["older_version", "newer_version"])
async def test_a_release_to_this_server_at_another_version_is_ignored(fence, nc, offset):
    js = nc.jetstream()
    await ownership.assign(nc, SID, "E")
    mine = await ownership.assign(nc, SID, "E")  # the same server at version 2: version 1 is a stale self
    client = EngineClient(nc, js, "E")
    await client.start()
    try:
        lease = await client.claim(SID, mine.version, cursor=0)
        items = aiter(lease)
        # Both carry the seq the lease expects next; only the one at its own version may be applied.
        await write(js, Release(server_id="E", version=mine.version + offset, items=[item(1, "other version")]))
        await write(js, Release(server_id="E", version=mine.version, items=[item(1, "mine")]))
        first = await asyncio.wait_for(anext(items), 10)
        assert (first.seq, first.data) == (1, b'"mine"')
        assert not lease.revoked.is_set()
    finally:
        await client.close()


async def test_a_feed_restarted_from_the_start_of_the_log_does_not_revoke_the_lease(fence, nc):
    """A host's ordered consumer that restarts from further back (nats-py restarts one that missed
    heartbeats before its first delivery from the stream's first record) delivers older owners'
    records again: they are history from before the claim, not a revocation, and no item is applied
    twice."""
    js = nc.jetstream()
    await ownership.assign(nc, SID, "A")
    old = await ownership.assign(nc, SID, "A")
    await write(js, Release(server_id="A", version=old.version, items=[item(1, "history")]))
    mine = await ownership.assign(nc, SID, "E")
    client = EngineClient(nc, js, "E")
    await client.start()
    try:
        lease = await client.claim(SID, mine.version, cursor=1)
        items = aiter(lease)
        await write(js, Release(server_id="E", version=mine.version, items=[item(2, "before restart")]))
        assert (await asyncio.wait_for(anext(items), 10)).seq == 2
        # What nats-py does when heartbeats stop before a delivery: a new consumer from stream seq 1.
        await client._feed._sub._sub._jsi.reset_ordered_consumer(1)
        await write(js, Release(server_id="E", version=mine.version, items=[item(3, "after restart")]))
        assert (await asyncio.wait_for(anext(items), 10)).seq == 3
        assert not lease.revoked.is_set()
    finally:
        await client.close()


async def test_one_consumer_per_host_however_many_leases(fence, nc):
    """Leases of many sessions on one host share its feed: the server holds one consumer for them, and
    each lease gets exactly its own session's items, in order."""
    js = nc.jetstream()
    sids = [f"many-{i}" for i in range(6)]
    client = EngineClient(nc, js, "E")
    await client.start()
    try:
        leases = {}
        for sid in sids:
            await ownership.assign(nc, sid, "A")  # an older owner elsewhere: its records are not ours
            mine = await ownership.assign(nc, sid, "E")
            leases[sid] = await client.claim(sid, mine.version, cursor=0)
        consumers = (await js.stream_info(names.SESSION_STREAM)).state.consumer_count
        assert consumers == 1
        for n in (1, 2):
            for sid, lease in leases.items():
                data = f'"{sid}/{n}"'.encode()
                release = Release(server_id="E", version=lease.owner.version,
                                  items=[InputItem(session_id=sid, seq=n, kind="text", data=data)])
                await session_log.append(js, sid, await session_log.read_tail(js, sid), release)
        for sid, lease in leases.items():
            items = aiter(lease)
            got = [await asyncio.wait_for(anext(items), 10) for _ in (1, 2)]
            assert [(i.session_id, i.seq, i.data) for i in got] == [(sid, n, f'"{sid}/{n}"'.encode()) for n in (1, 2)]
    finally:
        await client.close()


async def test_a_release_delivered_before_the_claim_is_answered_is_not_lost(fence, nc, monkeypatch):
    """The gateway may release right after the claim lands, and the host's feed deliver that release,
    before the claim's answer reaches the engine and the lease exists: the client holds it for the lease."""
    js = nc.jetstream()
    mine = await ownership.assign(nc, SID, "E")
    client = EngineClient(nc, js, "E")
    await client.start()
    request = bus.request
    held: list[bool] = []  # whether the release was delivered while the claim went unanswered

    async def answered_late(nc_, subject, msg, reply_type, **kw):
        reply = await request(nc_, subject, msg, reply_type, **kw)
        if subject == names.FENCE_CLAIM:
            await write(js, Release(server_id="E", version=mine.version, items=[item(1, "early")]))
            for _ in range(200):  # until the feed has delivered it, to nobody but the held records
                claims = client._claiming.get(SID, {})
                if any(isinstance(r.event, Release) for records in claims.values() for _, r in records):
                    held.append(True)
                    break
                await asyncio.sleep(0.01)
        return reply

    monkeypatch.setattr(bus, "request", answered_late)
    try:
        lease = await client.claim(SID, mine.version, cursor=0)
        assert held and client.lease(SID) is lease
        first = await asyncio.wait_for(anext(aiter(lease)), 10)
        assert (first.seq, first.data) == (1, b'"early"')
    finally:
        await client.close()
