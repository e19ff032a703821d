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
