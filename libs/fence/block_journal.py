"""The block journal on JetStream: which input items each block of a session consumed.

Stream `names.BLOCK_STREAM` (fence provisions it with its other streams), one subject per session (`names.block_journal_subject`), holding
`BlockEntry`s. Only the session's claimed owner writes, and only through `BlockJournal`:

    journal, entries = await BlockJournal.take(js, session_id, lease.owner)   # after the claim
    plan = replay.replay_plan(entries, info.blocks_done, info.consumed_seq)  # regenerate these
    await journal.append([ConsumedBlock(...), ...])   # before those blocks' output is published

`take` reads every entry and seals the journal (an entry without blocks) with compare-and-set on
the tail it read, so an older owner that is still running (a partition) can append nothing after
it: its next append finds the tail moved, reads the seal's higher version and is fenced
(`Conflict(reason="fenced")`). The rules are `libs/fence/replay.py`.
"""

from __future__ import annotations

import time

from libs import bus, errors, names
from libs.fence import replay
from libs.fence.session_log import EXPECTED_LAST_SUBJECT_SEQ, check_session_id
from libs.schemas.base import decode, encode
from libs.schemas.fence import BlockEntry, ConsumedBlock, Owner


async def read_tail(js: bus.JetStream, session_id: str) -> tuple[BlockEntry | None, int]:
    """The journal's last entry and its stream sequence ((None, 0) when the journal is empty)."""
    raw = await bus.last_msg(js, names.BLOCK_STREAM, names.block_journal_subject(session_id),
                                   what="the block journal", session_id=session_id)
    return (None, 0) if raw is None else (decode(raw.data, BlockEntry), raw.seq)


async def recorded_threads(js: bus.JetStream, session_id: str) -> int:
    """The intra-op thread count the session's journal records (`BlockEntry.threads`; 0: none recorded).
    Every entry of a session records the same count and a purge keeps the tail, so the tail tells it."""
    tail, _ = await read_tail(js, session_id)
    return tail.threads if tail is not None else 0


async def read_all(js: bus.JetStream, session_id: str, through: int) -> list[tuple[int, BlockEntry]]:
    """Every entry of the journal up to stream sequence `through`, in order, with its stream sequence,
    as the journal stood at one moment.

    The entries are read one direct get at a time while the owner may purge (`forget_through` after
    each checkpoint). A purge that lands mid-read would leave the entries read before it and those
    left after it: the journal with a hole where the purged ones were, which reads as blocks never
    recorded. A purge only removes everything below the entry it keeps, so if the first entry read is
    still the journal's first once the rest is read, nothing after it was purged meanwhile and the read
    is whole; otherwise it starts over."""
    subject = names.block_journal_subject(session_id)
    for _ in range(bus.MAX_CAS_ATTEMPTS):
        out: list[tuple[int, BlockEntry]] = []
        pos = 1
        while pos <= through:
            raw = await _next_entry(js, subject, pos, session_id)
            if raw is None or raw.seq > through:
                break
            out.append((raw.seq, decode(raw.data, BlockEntry)))
            pos = raw.seq + 1
        if not out:
            return out
        first = await _next_entry(js, subject, 1, session_id)
        if first is not None and first.seq == out[0][0]:
            return out
    raise errors.Unavailable("the block journal kept being purged while read", session_id=session_id)


async def _next_entry(js: bus.JetStream, subject: str, pos: int, session_id: str) -> bus.RawStreamMsg | None:
    """The journal's first message at stream sequence `pos` or after (None: there is none)."""
    return await bus.next_msg(js, names.BLOCK_STREAM, subject, pos, what="the block journal",
                                    session_id=session_id)


class BlockJournal:
    """The claimed owner's writer of one session's journal (see the module doc)."""

    def __init__(self, js: bus.JetStream, session_id: str, owner: Owner, tail_seq: int, threads: int = 0) -> None:
        self.js, self.session_id, self.owner = js, session_id, owner
        self.threads = threads  # recorded in every entry (BlockEntry.threads)
        self.tail_seq = tail_seq  # the stream sequence of our last entry: the next append's CAS
        self.entry_seqs: list[tuple[int, int]] = []  # (stream seq, last block) of the entries kept, for purging

    @classmethod
    async def take(cls, js: bus.JetStream, session_id: str, owner: Owner,
                   threads: int = 0) -> tuple[BlockJournal, list[BlockEntry]]:
        """Seal the journal for `owner` (its claim must have landed) and return what it held before.
        `threads`: the count the session's blocks run at, recorded in the seal and every entry after."""
        check_session_id(session_id)
        for _ in range(bus.MAX_CAS_ATTEMPTS):
            tail, seq = await read_tail(js, session_id)
            replay.decide_append(tail, owner)
            entries = await read_all(js, session_id, seq)
            journal = cls(js, session_id, owner, seq, threads)
            journal.entry_seqs = [(at, e.blocks[-1].block) for at, e in entries if e.blocks]
            try:
                await journal._publish(BlockEntry(server_id=owner.server_id, version=owner.version, threads=threads))
            except errors.Conflict:
                continue  # an older owner's entry landed meanwhile: read it too
            return journal, [e for _, e in entries]
        raise errors.Conflict("sealing the block journal kept losing the race", session_id=session_id)

    async def append(self, blocks: list[ConsumedBlock], quiet_through: int = 0) -> None:
        """Make `blocks` (and the quiet window after them, see `BlockEntry`) durable, or raise
        `Conflict(reason="fenced")` if a newer owner sealed the journal."""
        entry = BlockEntry(server_id=self.owner.server_id, version=self.owner.version, blocks=blocks,
                           quiet_through=quiet_through, threads=self.threads)
        for _ in range(bus.MAX_CAS_ATTEMPTS):
            try:
                await self._publish(entry)
                self.entry_seqs.append((self.tail_seq, blocks[-1].block))
                return
            except errors.Conflict:
                tail, seq = await read_tail(self.js, self.session_id)
                replay.decide_append(tail, self.owner)  # raises if someone newer sealed it
                if tail is not None and tail.blocks and tail.blocks[-1] == blocks[-1]:
                    self.tail_seq = seq  # our own append landed though its answer was lost
                    self.entry_seqs.append((seq, blocks[-1].block))
                    return
                self.tail_seq = seq
            except errors.Unavailable:
                continue  # unanswered: the retry's CAS tells whether it landed
        raise errors.Unavailable("block journal append kept failing", session_id=self.session_id)

    async def _publish(self, entry: BlockEntry) -> None:
        entry.at = time.time()
        self.tail_seq = await bus.append(
            self.js, names.block_journal_subject(self.session_id), encode(entry),
            {EXPECTED_LAST_SUBJECT_SEQ: str(self.tail_seq)}, what="the block journal", session_id=self.session_id)

    async def forget_through(self, block: int) -> None:
        """A checkpoint at `block` is recorded at fence: entries before the last one that ends at or
        before it are not needed by any replacement any more (that one says what the quiet blocks
        right after the checkpoint were). Later entries, landed or in flight, are never purged:
        `seq` purges strictly below the first entry kept."""
        ended = [seq for seq, last in self.entry_seqs if last <= block]
        keep_from = ended[-1] if ended else (self.entry_seqs[0][0] if self.entry_seqs else self.tail_seq)
        self.entry_seqs = [(seq, last) for seq, last in self.entry_seqs if seq >= keep_from]
        # Unavailable: it only costs storage until the next round.
        await bus.purge(self.js, names.BLOCK_STREAM, names.block_journal_subject(self.session_id),
                              keep_from=keep_from, what="the block journal", session_id=self.session_id)
