"""A T0 session's blocks are the same bytes on hosts whose torch intra-op thread counts differ (issue 29).

A replacement regenerates the dead owner's journalled blocks, and a move's destination runs the
session on; either may have another thread count than the host the session started on (`torch_threads`,
or the default derived from the cores and the hosts sharing them), and the avatar backend's bytes
differ between 1 and 2 threads (MKL's GEMM; each count deterministic). So a T0/T1 session keeps the
count it was first opened at (`OpenSession.threads`), carried by the move's descriptor, the checkpoint
and the block journal, and every host runs its blocks at that count. Two runtimes in this process
stand for the two hosts: each takes the count of the thread that builds it, as an engine host does.
"""

from __future__ import annotations

import json

import torch

from libs.checkpoint import clone_tree
from libs.schemas.base import decode
from libs.schemas.common import InputItem
from libs.schemas.engine import OpenSession, OutputChunk, SessionDescriptor
from services.engine_host import torch_threads
from services.engine_host.runtime import EngineRuntime


class Outputs:
    """Every chunk a runtime publishes, as {(session, block, kind, part): bytes}."""

    def __init__(self) -> None:
        self.parts: dict[tuple[str, int, str, int], bytes] = {}

    async def __call__(self, subject: str, payload: bytes) -> None:
        c = decode(payload, OutputChunk)
        self.parts[(c.session_id, c.block, c.kind, c.part)] = c.data

    def blocks(self, sid: str, first: int = 1) -> list[tuple[int, str, int, bytes]]:
        return sorted((b, k, p, d) for (s, b, k, p), d in self.parts.items() if s == sid and b >= first)


async def host(threads: int) -> tuple[EngineRuntime, Outputs]:
    """A runtime built (and so running) at `threads` intra-op threads."""
    before = torch.get_num_threads()
    torch_threads.pin(threads)
    try:
        out = Outputs()
        rt = EngineRuntime("cpu", publish=out)
        await rt.start()
        return rt, out
    finally:
        torch_threads.pin(before)


def text(sid: str, seq: int, words: str) -> InputItem:
    return InputItem(session_id=sid, seq=seq, kind="text", data=json.dumps(words).encode())


async def run(rt: EngineRuntime, spec: OpenSession) -> None:
    await rt.open(spec)
    await rt.apply_input(text(spec.session_id, 1, "good morning"))
    await rt.advance(spec.session_id, 2)


SPEC = OpenSession(session_id="av", backend="avatar", seed=7, prompt="narrator", determinism="T0")


async def test_a_t0_session_runs_at_its_first_hosts_count_on_a_host_with_another():
    two, two_out = await host(2)
    one, one_out = await host(1)
    try:
        assert (two.threads, one.threads) == (2, 1)
        await run(two, SPEC)
        pinned = two.info("av").threads
        assert pinned == 2  # pinned at its first open, from the host's count
        # The replacement: the same session from its seed at the count its journal records.
        await run(one, OpenSession(**{**{f: getattr(SPEC, f) for f in SPEC.__struct_fields__}, "threads": pinned}))
        assert one.info("av").threads == 2
        assert one_out.blocks("av") == two_out.blocks("av") and len(two_out.blocks("av")) >= 4
    finally:
        await one.stop()
        await two.stop()


async def test_a_moved_t0_session_keeps_its_count_and_its_bytes():
    two, two_out = await host(2)
    one, one_out = await host(1)
    try:
        await run(two, SPEC)
        async with two.block_boundary("av"):
            tree, desc = clone_tree(two.state_tree("av")), two.session_descriptor("av")
        assert decode(desc, SessionDescriptor).threads == 2
        await one.install_state("av", tree, desc)
        assert one.info("av").threads == 2
        for rt in (two, one):
            await rt.apply_input(text("av", 2, "and goodbye"))
            await rt.advance("av", 2)
        assert one_out.blocks("av", first=3) == two_out.blocks("av", first=3) != []
    finally:
        await one.stop()
        await two.stop()


async def test_a_t2_session_runs_at_each_hosts_own_count():
    one, _ = await host(1)
    try:
        await one.open(OpenSession(session_id="t2", backend="avatar", seed=7, determinism="T2", threads=2))
        assert one.info("t2").threads == 0 and one.sessions.get("t2").threads == 1
    finally:
        await one.stop()
