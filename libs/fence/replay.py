"""The block journal's rules, pure (no I/O): who may append, and which blocks a replacement regenerates.

The journal of a session (`sf.blocks.<sid>`) is a sequence of `BlockEntry`s, each appended with
compare-and-set on the journal's tail by the session's claimed owner `(server_id, version)`.
Versions never go down along the journal: a new owner's first write is a seal (an entry without
blocks), and an owner whose version is below the tail's is fenced. So once a replacement has
sealed, nothing an older owner still tries to write lands, and everything that landed before the
seal is exactly what older owners recorded before publishing those blocks' output.
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
    """The recorded blocks after `blocks_done`, in order, that a state at (`blocks_done`,
    `consumed_seq`) must regenerate before it takes live input. Each must start where the one
    before it ended; a gap or two different records of one block is an `IntegrityError`."""
    by_block: dict[int, ConsumedBlock] = {}
    for entry in entries:
        for b in entry.blocks:
            if b.block <= blocks_done:
                continue
            seen = by_block.setdefault(b.block, b)
            if seen != b:
                raise errors.IntegrityError(f"block {b.block} is recorded twice, differently", block=b.block)
    plan: list[ConsumedBlock] = []
    block, last = blocks_done, consumed_seq
    for index in sorted(by_block):
        b = by_block[index]
        if index != block + 1 or b.first_seq != last + 1 or b.last_seq < last:
            raise errors.IntegrityError(
                f"block {index} (items {b.first_seq}..{b.last_seq}) does not follow block {block} (item {last})",
                block=index, after_block=block, after_seq=last)
        plan.append(b)
        block, last = index, b.last_seq
    return plan
