"""A regenerated block does not go through the scheduler, so a block boundary's pause does not stop
it: a checkpoint taken while a replacement regenerated blocks read a tree one of them was writing,
and a later replacement that restored it regenerated every block after it differently. Invariant: a
checkpoint's tree is the session's state after exactly the blocks its descriptor names."""

from __future__ import annotations

import asyncio

import pytest
import torch

from libs import bus
from libs.checkpoint import CheckpointStore, clone_tree
from libs.checkpoint.tree import split
from libs.fence import session_log
from libs.fence.block_journal import BlockJournal
from libs.schemas.base import decode
from libs.schemas.engine import OpenSession, SessionDescriptor
from libs.schemas.fence import ConsumedBlock, Owner
from services.engine_host.backends import Registry
from services.engine_host.runtime import EngineRuntime
from tests.recovery.slow_backend import SOURCES

BLOCKS = 8
SPEC = OpenSession(session_id="held", backend="slow_avatar", seed=11, prompt="narrator", tier=1, quality_floor=1)


def same(a, b) -> bool:
    (ska, la), (skb, lb) = split(a), split(b)
    return ska == skb and len(la) == len(lb) and all(torch.equal(x, y) for x, y in zip(la, lb, strict=True))


async def reference_states(monkeypatch) -> list:
    """The session's state after 0..BLOCKS blocks, run by `advance` on a host nobody holds."""
    monkeypatch.setenv("SF_TEST_STAGE_SLOW_S", "0")
    rt = EngineRuntime(registry=Registry(SOURCES))
    await rt.start()
    try:
        await rt.open(SPEC)
        states = [clone_tree(rt.sessions.get(SPEC.session_id).state)]
        for _ in range(BLOCKS):
            await rt.advance(SPEC.session_id, 1)
            states.append(clone_tree(rt.sessions.get(SPEC.session_id).state))
        return states
    finally:
        await rt.stop()


@pytest.mark.timeout(120)
async def test_checkpoints_taken_while_blocks_regenerate_hold_the_state_their_descriptor_names(
        nc, tmp_path, monkeypatch):
    want = await reference_states(monkeypatch)
    monkeypatch.setenv("SF_TEST_STAGE_SLOW_S", "0.2")  # this host's stage time is switched up
    store = CheckpointStore(await bus.ensure_object_store(nc.jetstream(), "ckpt_held"), tmp_path / "ckpt")
    js = nc.jetstream()
    await session_log.provision(js)
    rt = EngineRuntime(registry=Registry(SOURCES), checkpoints=store, publish=nc.publish)
    await rt.start()
    try:
        await rt.open(SPEC, gated=True)  # as a replacement installs it: no block but the regenerated ones
        writer, _ = await BlockJournal.take(js, SPEC.session_id, Owner(server_id="h2", version=2))
        rt.attach_journal(SPEC.session_id, writer)  # a hold waits for its output, as on a fenced host

        async def regenerate() -> None:
            for b in range(1, BLOCKS + 1):
                await rt.replay_block(SPEC.session_id, ConsumedBlock(block=b, first_seq=1, last_seq=0, tier=1))

        replay = asyncio.create_task(regenerate())
        keys = []
        while not replay.done():  # the host's checkpoint loop, as often as it can go
            keys.append((await rt.checkpoint(SPEC.session_id, delete_previous=False)).key)
        await replay
        assert rt.info(SPEC.session_id).blocks_done == BLOCKS
        assert len(keys) >= 3, "the checkpoints did not overlap the regeneration"
        for key in keys:
            tree, raw = await store.get(key, "cpu")
            desc = decode(raw, SessionDescriptor)
            assert same(tree, want[desc.blocks_done]), f"checkpoint {key} is torn"
    finally:
        await rt.stop()
