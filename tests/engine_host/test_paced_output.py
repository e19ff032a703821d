"""A fenced C1 session's output is paced to its release grid (playout.py) through its journal, on a
real nats-server: every block goes out once, in order, none held past its deadline, while blocks that
are ready early (here: a backend whose time per block jitters) wait for their playout point."""

from __future__ import annotations

import asyncio
import random
import time

from libs.fence import session_log
from libs.fence.block_journal import BlockJournal
from libs.schemas.base import decode
from libs.schemas.engine import OpenSession, OutputChunk
from libs.schemas.fence import Owner
from services.engine_host.runtime import EngineRuntime

PERIOD_MS = 40.0


async def test_journaled_c1_output_is_held_to_its_playout_point_and_never_past_its_deadline(nc):
    js = nc.jetstream()
    await session_log.provision(js)
    published: list[tuple[float, int]] = []

    async def publish(subject: str, payload: bytes) -> None:
        chunk = decode(payload, OutputChunk)
        if chunk.part == 0 and chunk.kind == "frames":
            published.append((time.monotonic(), chunk.block))

    rt = EngineRuntime("cpu", host_id="h1", publish=publish)
    await rt.start()
    try:
        await rt.open(OpenSession(session_id="p", backend="world", seed=1, session_class="C1", period_ms=PERIOD_MS))
        backend = rt.sessions.get("p").backend
        denoise, rng = backend.denoise, random.Random(7)

        def jittery(state, carry, steps):  # a block's device time varies, as on a shared machine
            time.sleep(rng.uniform(0.0, 0.015))
            return denoise(state, carry, steps)

        backend.denoise = jittery
        rt.gate("p")
        writer, _ = await BlockJournal.take(js, "p", Owner(server_id="h1", version=1))
        rt.attach_journal("p", writer)
        rt.ungate("p")
        first = len(published)
        await asyncio.sleep(1.5)
        paced = [b for _, b in published[first:]]
        assert len(paced) > 10
        assert paced == list(range(paced[0], paced[0] + len(paced)))  # once each, in order
        m = rt.metrics("p")
        assert 0 < m.playout_hold_p95_ms <= PERIOD_MS  # early blocks waited; none past its deadline
    finally:
        await rt.stop()
