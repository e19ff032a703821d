"""The block journal's pure rules: who may append, and the plan a replacement regenerates."""

from __future__ import annotations

import pytest

from libs import errors
from libs.fence.replay import decide_append, replay_plan
from libs.schemas.fence import BlockEntry, ConsumedBlock, Owner


def entry(server: str, version: int, *blocks: tuple[int, int, int]) -> BlockEntry:
    return BlockEntry(server_id=server, version=version,
                      blocks=[ConsumedBlock(block=b, first_seq=f, last_seq=last, tier=4) for b, f, last in blocks])


def test_only_the_same_or_a_newer_owner_appends():
    decide_append(None, Owner(server_id="a", version=1))
    decide_append(entry("a", 1), Owner(server_id="a", version=1))
    decide_append(entry("a", 1), Owner(server_id="b", version=2))  # a replacement seals
    for tail, me in ((entry("b", 2), Owner(server_id="a", version=1)),   # the old owner, after the seal
                     (entry("b", 2), Owner(server_id="c", version=2))):  # a version is one server's
        with pytest.raises(errors.Conflict) as e:
            decide_append(tail, me)
        assert e.value.fields["reason"] == "fenced"


def test_plan_is_the_recorded_blocks_after_the_installed_state():
    journal = [entry("a", 1, (1, 1, 2), (2, 3, 2)), entry("a", 1, (3, 3, 5)), entry("b", 2),
               entry("b", 2, (4, 6, 6))]
    assert [b.block for b in replay_plan(journal, 0, 0)] == [1, 2, 3, 4]  # from the seed
    assert [b.block for b in replay_plan(journal, 2, 2)] == [3, 4]  # from a checkpoint at block 2
    assert replay_plan(journal, 4, 6) == []
    assert replay_plan(journal + [entry("b", 2, (4, 6, 6))], 2, 2)[-1].block == 4  # a retried append


@pytest.mark.parametrize("journal, done, consumed", [
    ([entry("a", 1, (3, 3, 5))], 1, 2),  # block 2 is missing
    ([entry("a", 1, (2, 4, 5))], 1, 2),  # item 3 is missing
    ([entry("a", 1, (2, 3, 4)), entry("b", 2, (2, 3, 5))], 1, 2),  # two different records of block 2
])
def test_a_broken_journal_is_an_integrity_error(journal, done, consumed):
    with pytest.raises(errors.IntegrityError):
        replay_plan(journal, done, consumed)


def quiet(server: str, version: int, through: int, *blocks: tuple[int, int, int], tier: int = 4) -> BlockEntry:
    e = entry(server, version, *blocks)
    return BlockEntry(server_id=e.server_id, version=e.version, quiet_through=through,
                      blocks=[ConsumedBlock(block=b.block, first_seq=b.first_seq, last_seq=b.last_seq, tier=tier)
                              for b in e.blocks])


def test_a_quiet_window_is_regenerated_item_less_at_the_last_recorded_tier():
    journal = [quiet("a", 1, 5, (1, 1, 1), tier=2), quiet("a", 1, 9, (4, 2, 3), tier=3)]
    plan = replay_plan(journal, 0, 0)
    assert [(b.block, b.first_seq, b.last_seq, b.tier) for b in plan] == [
        (1, 1, 1, 2), (2, 2, 1, 2), (3, 2, 1, 2),   # quiet under the first entry: no item, its tier
        (4, 2, 3, 3),                               # recorded (it consumed items 2..3)
        (5, 4, 3, 3), (6, 4, 3, 3), (7, 4, 3, 3), (8, 4, 3, 3), (9, 4, 3, 3)]  # the tail window
    # From a checkpoint inside a window: the entry before it still says what the window holds.
    assert [b.block for b in replay_plan(journal, 6, 3)] == [7, 8, 9]
    assert replay_plan(journal, 9, 3) == []


def test_a_block_outside_every_quiet_window_must_be_recorded():
    # Block 3 is past the first entry's window (through 2) and a later block is recorded: a hole.
    with pytest.raises(errors.IntegrityError):
        replay_plan([quiet("a", 1, 2, (1, 1, 1)), quiet("a", 1, 6, (4, 2, 2))], 0, 0)
