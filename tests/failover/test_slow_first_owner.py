"""Exact recovery does not depend on how busy the dead owner was (issue 29). Two engine-host processes:
the first owner's stage time is switched up while it serves, so its scheduler takes other tier and
skip decisions than a fast host would (it falls behind, learns a high cost, steps its tier and skips
hopeless releases); it is SIGKILLed, and the fast replacement regenerates every block the journal
recorded. Invariant: each regenerated block's output is byte-identical to what the slow owner
published for that block index: what a block's bytes depend on is in the journal, not in the speed
of the host that ran it."""

from __future__ import annotations

import asyncio
import hashlib
from collections import defaultdict

import pytest

from libs import bus, names
from libs.contracts import Contract
from libs.fence import block_journal
from libs.fence.replay import replay_plan
from libs.schemas.engine import OutputChunk
from tests.support.invariants import check_log, read_log
from tests.support.waiting import eventually

# A period for the slow owner to miss: its denoise stage takes SLOW_S longer than the period. Admission
# prices every stage of a block (an avatar's start-up block read up to 481 ms at load 20): the period must admit one.
CONTRACT = Contract(session_class="C1", quality_floor=1, determinism="T1", period_ms=1000.0)
SLOW_S = "1.1"
SOURCES = '[backend_sources]\nslow_avatar = "tests.recovery.slow_backend:SlowAvatar"\n'


class Published:
    """Each block's output as published (frames and audio reassembled from their parts), live and replayed."""

    def __init__(self) -> None:
        self._parts: dict[tuple[int, str, bool], dict[int, bytes]] = defaultdict(dict)
        self._count: dict[tuple[int, str, bool], int] = {}

    async def on_chunk(self, c: OutputChunk) -> None:
        if c.kind in ("frames", "audio"):
            key = (c.block, c.kind, c.replayed)
            self._parts[key][c.part] = c.data
            self._count[key] = c.parts

    def digests(self, replayed: bool) -> dict[tuple[int, str], str]:
        return {(block, kind): hashlib.sha256(b"".join(parts[i] for i in range(len(parts)))).hexdigest()
                for (block, kind, rep), parts in self._parts.items()
                if rep is replayed and len(parts) == self._count[(block, kind, rep)]}


@pytest.mark.timeout(300)
async def test_blocks_a_slow_owner_ran_regenerate_byte_identical_on_a_fast_replacement(stack, tmp_path):
    config = tmp_path / "slow_avatar.toml"
    config.write_text(SOURCES)
    slow = tmp_path / "e0.slow"  # e0's stage time: absent (0) while it profiles itself, switched up later
    await stack.start()
    # No checkpoint during the test: the replacement regenerates every block from the first.
    await stack.engines_up("e0", config=config, SF_TEST_STAGE_SLOW_FILE=str(slow), SF_CHECKPOINT_EVERY_S="600")
    sid = "slow"
    out = Published()
    await bus.subscribe_events(stack.nc, names.output_subject(sid), OutputChunk, out.on_chunk)
    await stack.create(sid, contract=CONTRACT, backend="slow_avatar")
    await stack.send(sid, 1, 3)
    await eventually(lambda: stack.consumed(sid, 3), 60, what="items 1-3 applied on e0")
    slow.write_text(SLOW_S)  # the first owner turns slow: every block now overruns the period
    await stack.send(sid, 4, 12)
    await eventually(lambda: stack.consumed(sid, 12), 120, what="items 4-12 applied on the slow e0")
    await asyncio.sleep(1.0)  # more slow blocks, some item-less
    await stack.engines_up("e1", config=config, SF_CHECKPOINT_EVERY_S="600")  # fast: no slow file
    _, tail = await block_journal.read_tail(stack.js, sid)
    slow_plan = replay_plan([e for _, e in await block_journal.read_all(stack.js, sid, tail)], 0, 0)
    stack.engines["e0"].kill()
    await eventually(lambda: stack.claimed_by(sid, "e1", min_version=2), 60, what="e1's claim")
    await stack.send(sid, 13, 15)
    await eventually(lambda: stack.consumed(sid, 15), 120, what="items 13-15 applied on e1")

    recorded = {b.block for b in slow_plan}
    live = out.digests(replayed=False)
    await eventually(lambda: recorded <= {b for b, _ in out.digests(replayed=True)}, 60,
                     what=f"every recorded block regenerated ({sorted(recorded)})")
    replayed = out.digests(replayed=True)
    compared = [key for key in replayed if key in live]
    differing = [key for key in compared if replayed[key] != live[key]]
    assert not differing, f"regenerated blocks differ from the slow owner's: {sorted(differing)}"
    # The comparison covered what the slow owner ran: every block it recorded and published before the
    # kill (a block is journalled before its output leaves, and a C1 block's output waits for its
    # playout point, so the newest recorded ones may never have gone out), the slow ones among them.
    published = {b for b, _ in live if b in recorded}
    assert published <= {b for b, _ in compared}, sorted(published - {b for b, _ in compared})
    slow_blocks = [b.block for b in slow_plan if b.block in published and b.last_seq > 3]
    assert len(slow_blocks) >= 3, (slow_blocks, sorted(published))
    assert slow_plan[-1].last_seq >= 12
    check_log(await read_log(stack.js, sid))
