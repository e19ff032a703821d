"""Bounded read-ahead on the worker pool: the one prefetch loop both senders share.

`Prefetch` submits `fn(item)` for up to `depth` items ahead and hands out the
futures in item order. It never waits itself, so a thread takes each result
with `.result()` and a coroutine with `await asyncio.wrap_future(...)`; either
way at most `depth` jobs (and their buffers) exist at once, and leaving the
`with` block cancels whatever was not taken and waits for what already runs:
once it is left, no job touches the buffers any more (a shared-memory push
writes into a peer's mapping, which its caller then unmaps). Only a round that
ends early (an error) leaves jobs behind, at most `depth` chunks of work.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor, Future, wait
from typing import Generic, TypeVar

from libs.motion import crc

PREFETCH = 4  # chunks read, checksummed (and encoded) ahead of the one being sent

In = TypeVar("In")
Out = TypeVar("Out")


class Prefetch(Generic[In, Out]):
    def __init__(self, fn: Callable[[In], Out], items: Sequence[In], depth: int = PREFETCH,
                 pool: Executor = crc.pool) -> None:
        self.fn, self.items, self.depth, self.pool = fn, items, depth, pool
        self.pending: deque[Future[Out]] = deque()
        self.handed: Future[Out] | None = None  # the last future handed out: its job may still run

    def __iter__(self) -> Iterator[Future[Out]]:
        nxt = 0
        for _ in range(len(self.items)):
            while nxt < len(self.items) and len(self.pending) < self.depth:
                self.pending.append(self.pool.submit(self.fn, self.items[nxt]))
                nxt += 1
            self.handed = self.pending.popleft()
            yield self.handed

    def __enter__(self) -> Prefetch[In, Out]:
        return self

    def __exit__(self, *exc: object) -> None:
        for f in self.pending:
            f.cancel()
        wait([*self.pending, *([self.handed] if self.handed else [])])
        self.pending.clear()
