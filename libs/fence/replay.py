"""The block journal's rules, pure (no I/O): who may append, and which blocks a replacement regenerates.

The journal of a session (`sf.blocks.<sid>`) is a sequence of `BlockEntry`s, each appended with
compare-and-set on the journal's tail by the session's claimed owner `(server_id, version)`.
Versions never go down along the journal: a new owner's first write is a seal (an entry without
blocks), and an owner whose version is below the tail's is fenced. So once a replacement has
sealed, nothing an older owner still tries to write lands, and everything that landed before the
seal is exactly what older owners recorded before publishing those blocks' output.

A block that consumed no item at the tier of the owner's last recorded block needs no record of its
own while the last entry's `quiet_through` covers it: most blocks of a session consume nothing
(input arrives far slower than blocks), so an owner records about once per quiet window instead of
once per block, and a replacement regenerates the whole window, item-less (bit-identical to what
was shown, and only delaying input for the part that was never shown).
"""

from __future__ import annotations

from collections.abc import Iterable

from libs import errors
from libs.schemas.fence import BlockEntry, ConsumedBlock, Owner


def decide_append(tail: BlockEntry | None, me: Owner) -> None:
    """Raise `Conflict(reason="fenced")` unless `me` may append right after `tail` (None: empty journal)."""
    if tail is None or tail.version < me.version:
        return
    if tail.version == me.version and tail.server_id == me.server_id:
        return
    raise errors.Conflict(f"the block journal belongs to {tail.server_id} at version {tail.version}",
                          server_id=me.server_id, version=me.version, holder=tail.server_id,
                          holder_version=tail.version, reason="fenced")


def replay_plan(entries: Iterable[BlockEntry], blocks_done: int, consumed_seq: int) -> list[ConsumedBlock]:
    """The blocks after `blocks_done`, in order, that a state at (`blocks_done`, `consumed_seq`) must
    regenerate before it takes live input: each recorded one, and each one an entry's `quiet_through`
    covers that no later entry records (it consumed no item, at that entry's last block's tier).
    Each must start where the one before it ended; a gap or two different records of one block is
    an `IntegrityError`."""
    by_block: dict[int, ConsumedBlock] = {}
    quiet: dict[int, tuple[int, int]] = {}  # an entry's last block -> (its quiet_through, that block's tier)
    for entry in entries:
        if entry.blocks:
            last_block = entry.blocks[-1]
            quiet[last_block.block] = (entry.quiet_through, last_block.tier)
        for b in entry.blocks:
            if b.block <= blocks_done:
                continue
            seen = by_block.setdefault(b.block, b)
            if seen != b:
                raise errors.IntegrityError(f"block {b.block} is recorded twice, differently", block=b.block)
    ends = sorted(quiet)
    end = max([*by_block, *(through for through, _ in quiet.values())], default=blocks_done)
    plan: list[ConsumedBlock] = []
    block, last = blocks_done, consumed_seq
    for index in range(blocks_done + 1, end + 1):
        b = by_block.get(index) or _quiet_block(index, last, ends, quiet)
        if b is None:
            if any(later > index for later in by_block):
                raise errors.IntegrityError(f"block {index} is not recorded, yet a later block is",
                                            block=index, after_block=block, after_seq=last)
            break
        if b.first_seq != last + 1 or b.last_seq < last:
            raise errors.IntegrityError(
                f"block {index} (items {b.first_seq}..{b.last_seq}) does not follow block {block} (item {last})",
                block=index, after_block=block, after_seq=last)
        plan.append(b)
        block, last = index, b.last_seq
    return plan


def _quiet_block(index: int, last: int, ends: list[int], quiet: dict[int, tuple[int, int]]) -> ConsumedBlock | None:
    """Block `index` as the latest entry before it declares it (no item), or None if none covers it."""
    before = [end for end in ends if end < index]
    if not before:
        return None
    through, tier = quiet[before[-1]]
    return ConsumedBlock(block=index, first_seq=last + 1, last_seq=last, tier=tier) if index <= through else None
