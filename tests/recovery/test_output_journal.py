"""The output gate against a real nats-server: no block's output leaves before the journal, as a
replacement would read it, says exactly what that block was (recorded, or inside a quiet window)."""

from __future__ import annotations

import asyncio

import torch

from libs.fence import session_log
from libs.fence.block_journal import BlockJournal, read_all, read_tail
from libs.fence.replay import replay_plan
from libs.schemas.fence import ConsumedBlock, Owner
from services.engine_host.backends import Output
from services.engine_host.journal import Finished, OutputJournal

OUT = Output(frames=torch.zeros(0, dtype=torch.uint8))


async def journal_says(js, sid: str) -> list[ConsumedBlock]:
    _, tail = await read_tail(js, sid)
    return replay_plan([e for _, e in await read_all(js, sid, tail)], 0, 0)


def blocks(n: int) -> list[ConsumedBlock]:
    """Sparse input (an item every 7th block) and a tier change: both recorded and quiet blocks."""
    out, seq = [], 0
    for b in range(1, n + 1):
        took = 1 if b % 7 == 0 else 0
        out.append(ConsumedBlock(block=b, first_seq=seq + 1, last_seq=seq + took, tier=2 if b > 30 else 4))
        seq += took
    return out


async def test_no_output_leaves_before_the_journal_says_what_it_was(nc):
    js = nc.jetstream()
    await session_log.provision(js)
    writer, _ = await BlockJournal.take(js, "s1", Owner(server_id="a", version=1))
    shown: list[int] = []

    async def publish(block: int, output: Output, replayed: bool, last_seq: int, release: float | None) -> None:
        plan = await journal_says(js, "s1")  # what a replacement taking over now would regenerate
        assert len(plan) >= block and plan[block - 1] == expected[block - 1], f"block {block} left unrecorded"
        shown.append(block)

    expected = blocks(60)
    journal = OutputJournal(writer, publish, quiet_blocks=5)
    for b in expected:
        journal.add(Finished(b, OUT, False))
        await asyncio.sleep(0.002)
    await asyncio.wait_for(journal.flushed(), 10)
    assert (await journal_says(js, "s1"))[-1].block > 60  # a window open past the last block run
    await journal.close_window()  # a block boundary (a move's copy): the window ends at block 60
    assert await journal_says(js, "s1") == expected
    await journal.close()
    assert shown == list(range(1, 61))
    _, tail = await read_tail(js, "s1")
    assert len(await read_all(js, "s1", tail)) < 40  # quiet blocks took no append of their own


async def test_a_sealed_journal_lets_out_only_what_the_new_owner_regenerates_identically(nc):
    js = nc.jetstream()
    await session_log.provision(js)
    writer, _ = await BlockJournal.take(js, "s2", Owner(server_id="a", version=1))
    shown: list[ConsumedBlock] = []
    expected = blocks(6)  # block 7 consumes an item

    async def publish(block: int, output: Output, replayed: bool, last_seq: int, release: float | None) -> None:
        shown.append(expected[block - 1])

    old = OutputJournal(writer, publish, quiet_blocks=4)
    old.add(Finished(expected[0], OUT, False))
    await asyncio.wait_for(old.flushed(), 10)
    _, entries = await BlockJournal.take(js, "s2", Owner(server_id="b", version=2))  # presumed dead
    for b in expected[1:5]:
        old.add(Finished(b, OUT, False))
    await asyncio.wait_for(old.flushed(), 10)
    for b in [expected[5], ConsumedBlock(block=7, first_seq=1, last_seq=1, tier=4)]:
        old.add(Finished(b, OUT, False))
    await asyncio.wait_for(old.fenced.wait(), 10)  # block 6 is past the window: its append is refused
    await old.close()
    regenerated = replay_plan(entries, 0, 0)
    assert [b.block for b in shown] == [1, 2, 3, 4, 5]  # the window (through 5) and nothing after it
    assert shown == regenerated  # every shown block is what the replacement regenerates


async def test_pruning_while_appends_are_in_flight_keeps_what_a_replacement_needs(nc):
    """`forget_through` after each checkpoint, racing the appends still in flight: a replacement that
    restores any of those checkpoints still finds every block after it (and the window before it)."""
    js = nc.jetstream()
    await session_log.provision(js)
    writer, _ = await BlockJournal.take(js, "s3", Owner(server_id="a", version=1))
    expected = blocks(120)
    journal = OutputJournal(writer, lambda *_: asyncio.sleep(0), quiet_blocks=5)
    checkpoints = []
    for b in expected:
        journal.add(Finished(b, OUT, False))
        if b.block % 9 == 0:  # the checkpoint loop runs beside the journal task, mid-append
            checkpoints.append((b.block, b.last_seq))
            await journal.forget_through(b.block)
        await asyncio.sleep(0)
    await asyncio.wait_for(journal.flushed(), 10)
    await journal.close()
    _, tail = await read_tail(js, "s3")
    entries = [e for _, e in await read_all(js, "s3", tail)]
    done, consumed = checkpoints[-1]
    plan = replay_plan(entries, done, consumed)
    assert plan[: len(expected) - done] == expected[done:]
    assert all(b.first_seq > b.last_seq for b in plan[len(expected) - done:])  # the open quiet window


class PurgeMidRead:
    """The owner's `forget_through` landing while `read_all` is between two direct gets: the
    JetStream context as the reader uses it, which runs the (real) purge after the `after`-th get."""

    def __init__(self, js, purge, after: int) -> None:
        self.js, self.purge, self.after, self.gets = js, purge, after, 0

    def __getattr__(self, name):
        return getattr(self.js, name)

    async def get_msg(self, *args, **kwargs):
        raw = await self.js.get_msg(*args, **kwargs)
        self.gets += 1
        if self.gets == self.after:
            await self.purge()
        return raw


async def test_a_purge_during_a_read_never_leaves_a_hole_in_what_is_read(nc):
    """A purge removes a prefix, so a read must see the journal from before it or from after it,
    never its start from before and its rest from after: that reads as blocks recorded once and
    missing (seen as "block 39 is not recorded, yet a later block is" at the end of
    test_sigkilled_owner_is_replaced_and_its_blocks_regenerate_bit_identical, h2's first purge
    landing mid-read)."""
    js = nc.jetstream()
    await session_log.provision(js)
    writer, _ = await BlockJournal.take(js, "s4", Owner(server_id="a", version=1))
    expected = [ConsumedBlock(block=b, first_seq=b, last_seq=b, tier=4) for b in range(1, 7)]
    for b in expected:
        await writer.append([b], b.block)
    _, tail = await read_tail(js, "s4")
    before = [seq for seq, _ in await read_all(js, "s4", tail)]
    read = await read_all(PurgeMidRead(js, lambda: writer.forget_through(4), after=2), "s4", tail)
    after = [seq for seq, _ in await read_all(js, "s4", tail)]
    assert after == before[4:]  # the purge kept the entry of block 4 and everything after it
    assert [seq for seq, _ in read] in (before, after)
    entries = [e for _, e in read]
    assert replay_plan(entries, 4, 4) == expected[4:]  # from the checkpoint the purge followed
