"""Exact recovery: a replacement regenerates every block after the checkpoint it restores, bit for
bit, from the block journal; a partitioned old owner is fenced out of the journal and publishes
nothing more. Engine hosts are real processes (SIGKILL, SIGSTOP); fence's assign is driven here
the way placement's failover drives it."""

from __future__ import annotations

import asyncio
import signal

import msgspec
import pytest

from libs.contracts import Contract
from libs.errors import IntegrityError
from libs.fence.ownership import assign
from libs.fence.replay import replay_plan
from tests.support.invariants import check_log, read_log
from tests.support.ownership import claimed_by
from tests.support.recovery import CONTRACT, OutputLog, Producer, info, journal, meta, register, watch_output
from tests.support.waiting import STARTING, eventually

pytestmark = pytest.mark.slow


async def serve_on_h1(nc, fence, hosts, sid: str, h1_env: dict | None = None, h2_env: dict | None = None,
                     contract: Contract = CONTRACT):
    """h1 and h2 up (each with its settings), `sid` claimed by h1 under steady input."""
    h1, h2 = hosts("h1", **(h1_env or {})), hosts("h2", **(h2_env or {}))
    await asyncio.gather(h1.ready(nc), h2.ready(nc))
    token = await register(nc, sid, contract=contract)
    out = await watch_output(nc, sid)
    v1 = (await assign(nc, sid, "h1")).version
    await eventually(lambda: claimed_by(nc, sid, "h1"), what="h1's claim", tolerate=STARTING)
    producer = Producer(f"http://127.0.0.1:{fence.http_port}", sid, token)
    producer.start()
    return h1, h2, v1, out, producer


async def serve_until_checkpointed(nc, fence, hosts, sid: str):
    """h1 and h2 up, `sid` on h1 under steady input, a checkpoint recorded and blocks past it shown."""
    h1, h2, v1, out, producer = await serve_on_h1(nc, fence, hosts, sid)

    async def past_a_checkpoint() -> bool:
        block = (await meta(nc, sid)).checkpoint_block
        shown = out.blocks(replayed=False)
        return block > 0 and bool(shown) and max(shown) >= block + 4

    await eventually(past_a_checkpoint, what="blocks past a checkpoint", tolerate=STARTING)
    return h1, h2, v1, out, producer


async def take_over(nc, sid: str, v1: int, out: OutputLog, last_dead_block: int, timeout_s: float = 30.0) -> None:
    """Assign `sid` to h2 (as failover does: only if h1 still holds v1) and wait for live output past h1's."""
    await assign(nc, sid, "h2", expect_version=v1)
    await eventually(lambda: claimed_by(nc, sid, "h2"), what="h2's claim", tolerate=STARTING)

    async def live_past() -> bool:
        return max(out.blocks(replayed=False)) > last_dead_block + 3

    await eventually(live_past, timeout_s=timeout_s, what="live output on h2", tolerate=STARTING)


async def finish_input(nc, sid: str, producer: Producer) -> None:
    await producer.stop()
    last = producer.acked[-1]
    assert producer.acked == list(range(1, last + 1))

    async def all_consumed() -> bool:
        i = await info(nc, "h2", sid)
        return i.consumed_seq == last and i.input_cursor == last

    # h2's runtime refuses a gap or a duplicate seq, so consuming exactly 1..last from the restored
    # cursor means no input was lost and none applied twice.
    await eventually(all_consumed, what="every item consumed on h2", tolerate=STARTING)


def assert_exact(out: OutputLog, dead: dict, checkpoint_block: int) -> None:
    replayed = out.blocks(replayed=True)
    must = sorted(b for b in dead if b > checkpoint_block)
    assert must, "the dead host showed no block after the checkpoint"
    assert min(replayed) == checkpoint_block + 1  # regeneration starts right after the restored checkpoint
    for b in must:
        got = replayed.get(b, [])
        # A block goes out as several chunks (its frames, then its audio), so the kill may cut the dead
        # host's last block short: each piece it did emit must be regenerated as is; earlier blocks whole.
        shown = [p for p in got if p in dead[b]] if b == max(dead) else got
        assert shown == dead[b], f"regenerated block {b} differs from what the dead host emitted"
    live = out.blocks(replayed=False)
    # An old owner stopped between recording a block and publishing it may publish that block once it
    # resumes (it was recorded before the seal, so it is history): only as the bit-identical copy.
    late = [b for b in live if max(must) < b <= max(replayed)]
    assert all(live[b] == replayed[b] for b in late), "an old owner published a block that differs"
    assert min(b for b in live if b > max(replayed)) == max(replayed) + 1  # live blocks follow the regenerated ones
    assert out.published_twice() == []


def assert_journal_chain(entries) -> None:
    """The journal's records (those kept after the last checkpoint) cover consecutive items, block after
    block: recorded ones, and quiet ones (no item) inside a quiet window of the entry before them."""
    records = {b.block: b for e in entries for b in e.blocks}
    first = records[min(records)]
    shown = [(e.server_id, e.version, [(b.block, b.first_seq, b.last_seq, b.tier) for b in e.blocks], e.quiet_through) for e in entries]
    try:
        plan = replay_plan(entries, first.block - 1, first.first_seq - 1)  # raises on a gap
    except IntegrityError as e:
        raise AssertionError(f"{e.detail}; journal: {shown}") from None
    assert plan[-1].block >= max(records) and all(records.get(b.block, b) == b for b in plan), shown
    for prev, cur in zip(plan, plan[1:], strict=False):
        assert cur.block == prev.block + 1 and cur.first_seq == prev.last_seq + 1


async def test_sigkilled_owner_is_replaced_and_its_blocks_regenerate_bit_identical(nats_server, nc, fence, hosts):
    sid = "exact-kill"
    h1, _, v1, out, producer = await serve_until_checkpointed(nc, fence, hosts, sid)
    h1.signal(signal.SIGKILL)
    h1.proc.wait()
    dead = out.blocks(replayed=False)
    await asyncio.sleep(0.3)  # input goes on: stored, some of it released to the dead owner
    restored = await meta(nc, sid)
    await take_over(nc, sid, v1, out, max(dead))
    await finish_input(nc, sid, producer)
    assert_exact(out, dead, restored.checkpoint_block)
    assert_journal_chain(await journal(nc, sid))
    check_log(await read_log(nc.jetstream(), sid))


async def test_partitioned_old_owner_is_fenced_out_of_the_journal(nats_server, nc, fence, hosts):
    sid = "exact-stop"
    h1, _, v1, out, producer = await serve_until_checkpointed(nc, fence, hosts, sid)
    h1.signal(signal.SIGSTOP)
    await asyncio.sleep(0.2)
    dead = out.blocks(replayed=False)
    restored = await meta(nc, sid)
    await take_over(nc, sid, v1, out, max(dead))
    h1.signal(signal.SIGCONT)  # it still holds the session, with blocks in flight and output queued
    await asyncio.sleep(2.0)
    await finish_input(nc, sid, producer)
    assert_exact(out, dead, restored.checkpoint_block)  # incl.: h1 published no block h2 also published
    entries = await journal(nc, sid)
    versions = [e.version for e in entries]
    assert versions == sorted(versions) and versions[-1] == v1 + 1
    taken = next(i for i, e in enumerate(entries) if e.version == v1 + 1)  # h2's seal, or its first kept entry
    assert all(e.server_id == "h2" for e in entries[taken:])
    check_log(await read_log(nc.jetstream(), sid))  # nothing was released to v1 after v2's assign


async def test_a_replacement_at_another_thread_count_regenerates_the_same_bytes(nats_server, nc, fence, hosts):
    """h1 runs two torch threads, h2 one, and h1 never checkpoints: h2 starts the session from its
    seed at the count h1's journal records and regenerates every block h1 showed, bit for bit (the
    avatar's bytes differ between 1 and 2 threads: tests/engine_host/test_thread_count_bits.py).
    The avatar's own media period keeps the blocks h1 shows, and so h2's replay from the seed, short."""
    sid = "exact-threads"
    h1, _, v1, out, producer = await serve_on_h1(nc, fence, hosts, sid,
                                                 {"SF_TORCH_THREADS": "2", "SF_CHECKPOINT_EVERY_S": "3600"},
                                                 {"SF_TORCH_THREADS": "1"},
                                                 msgspec.structs.replace(CONTRACT, period_ms=400.0))

    async def shown_with_items() -> bool:
        return len(out.blocks(replayed=False)) >= 6 and (await info(nc, "h1", sid)).consumed_seq >= 3

    await eventually(shown_with_items, what="h1's blocks with items in them", tolerate=STARTING)
    assert (await info(nc, "h1", sid)).threads == 2
    h1.signal(signal.SIGKILL)
    h1.proc.wait()
    dead = out.blocks(replayed=False)
    assert (await meta(nc, sid)).checkpoint_block == 0
    await take_over(nc, sid, v1, out, max(dead), timeout_s=120.0)
    await finish_input(nc, sid, producer)
    assert_exact(out, dead, 0)
    assert (await info(nc, "h2", sid)).threads == 2
    assert {e.threads for e in await journal(nc, sid)} == {2}
