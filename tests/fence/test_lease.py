"""The engine's lease takes exactly the releases addressed to its own `(server_id, version)`.

Records here are written straight into the session log, past fence's decisions, so the
lease's own filter is what is tested: the log is the only thing an engine trusts.
"""

from __future__ import annotations

import asyncio

import pytest

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
    await ownership.assign(nc, js, SID, "E")
    mine = await ownership.assign(nc, js, SID, "E")  # the same server at version 2: version 1 is a stale self
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
