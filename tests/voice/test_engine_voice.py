"""A talking-head session on the engine host's runtime (no bus needed: output goes to a callback).

Invariants: a `clear` that reaches the engine behind more items than fence's owner credit (256) is
applied by the very next block, with every item before it dropped unplayed, never held behind the
engine's own queue bound; a talking head's blocks go out when done (its clients pace the media),
while other C1 sessions keep their playout point."""

from __future__ import annotations

import msgspec
import numpy as np

from libs.schemas.engine import OpenSession, OutputChunk
from services.engine_host.runtime import EngineRuntime
from statefleet.client import AvatarBlock, BlockAssembler
from tests.support.waiting import eventually
from tests.voice.helpers import audio_item, control_item, tone

PERIOD_MS = 160.0
QUEUED = 300  # more than fence's default owner credit (max_unapplied_items, 256)


def talking_head(sid: str) -> OpenSession:
    return OpenSession(session_id=sid, backend="talking_head", seed=2, prompt="presenter", session_class="C1",
                       period_ms=PERIOD_MS)


async def test_a_clear_behind_more_than_256_queued_items_is_applied_by_the_next_block():
    assembler, blocks = BlockAssembler(), []

    async def publish(subject: str, payload: bytes) -> None:
        blocks.extend(assembler.add(msgspec.msgpack.decode(payload, type=OutputChunk)))

    rt = EngineRuntime("cpu", host_id="h1", publish=publish)
    await rt.start()
    try:
        await rt.open(talking_head("c"))
        rt.gate("c")  # no block runs while the queue builds up (as behind a stalled owner)
        stale = tone(0.1)
        for seq in range(1, QUEUED + 1):
            await rt.apply_input(audio_item(seq, stale, "c"))
        await rt.apply_input(control_item(QUEUED + 1, "clear", "c"))
        fresh = tone(0.1, freq=300.0)
        await rt.apply_input(audio_item(QUEUED + 2, fresh, "c"))
        before = len(blocks)
        rt.ungate("c")
        await eventually(lambda: any(b.events for b in blocks[before:]), timeout_s=60, what="the cleared event")
        first: AvatarBlock = next(b for b in blocks[before:] if b.input_seq > 0)
        assert [e.event for e in first.events] == ["cleared"] and first.events[0].seq == QUEUED + 1
        assert first.input_seq == QUEUED + 2  # the first block after the queue took all of it
        assert np.array_equal(first.audio, fresh)  # and played only what came after the clear
        assert all(b.audio.shape[0] == 0 for b in blocks[:blocks.index(first)])  # nothing stale before it
        state = rt.sessions.get("c").state
        # every stale sample was dropped unplayed: what the ring held (its capacity) or overflowed
        assert first.events[0].dropped + state["overflow"] == QUEUED * stale.shape[0]
        assert state["played"] == fresh.shape[0]
    finally:
        await rt.stop()


async def test_a_talking_head_is_published_when_done_and_other_c1_sessions_keep_their_playout_point():
    rt = EngineRuntime("cpu", host_id="h1")
    await rt.start()
    try:
        await rt.open(talking_head("t"))
        await rt.open(OpenSession(session_id="w", backend="world", seed=1, session_class="C1", period_ms=40.0))
        assert rt.sessions.get("t").playout is None
        assert rt.sessions.get("w").playout is not None
    finally:
        await rt.stop()
