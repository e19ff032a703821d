"""The ids of a session's recently stored items, so a resent item is answered, not stored twice.

A client may give an item an `id`. If its answer was lost (a dropped connection, a 503 for a store
that did land) it resends the item with the same id, to any ingress instance, and gets the first
item's seq back instead of a second copy.

Each instance's writer knows exactly which batches exist up to the tail its last successful
compare-and-set confirmed, so its index is exact up to there: whenever the tail moves under it
(another instance stored, or a store's outcome was unknown) the writer reads the batches it has not
seen before numbering anything. Loaded lazily, the first time a session's group carries an id: the
last `window` items are read from the stream then.
"""

from __future__ import annotations

from collections import OrderedDict

from libs import bus
from libs.schemas.fence import InputBatch
from services.fence import input_reads


class RecentIds:
    def __init__(self, window: int) -> None:
        self.window = window
        self._seqs: OrderedDict[str, int] = OrderedDict()
        self.pos = 0  # stream seq up to which every stored id is known

    def get(self, item_id: str) -> int | None:
        return self._seqs.get(item_id)

    def remember(self, batch: InputBatch, pos: int) -> None:
        for item, item_id in zip(batch.items, batch.item_ids, strict=False):
            if item_id:
                self._seqs[item_id] = item.seq
                self._seqs.move_to_end(item_id)
        while len(self._seqs) > self.window:
            self._seqs.popitem(last=False)
        self.pos = max(self.pos, pos)

    @classmethod
    async def load(cls, js: bus.JetStream, session_id: str, window: int, last_seq: int) -> RecentIds:
        ids = cls(window)
        start = await input_reads.locate(js, session_id, max(1, last_seq - window + 1))
        await ids.catch_up(js, session_id, start)
        return ids

    async def catch_up(self, js: bus.JetStream, session_id: str, start: int | None = None) -> None:
        """Read every batch after `pos` (or from `start`) to the end of the session's input."""
        pos = start if start is not None else self.pos + 1
        while found := await input_reads.next_batch(js, session_id, pos):
            batch, stream_seq = found
            self.remember(batch, stream_seq)
            pos = stream_seq + 1
