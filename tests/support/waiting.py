"""Waiting for a condition rather than for a time: the suite must pass on a loaded machine."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from typing import Any


async def eventually(fn: Callable[[], Any], timeout_s: float = 30.0, every_s: float = 0.05,
                     what: str = "condition", tolerate: tuple[type[BaseException], ...] = ()) -> Any:
    """The first truthy value `fn()` returns (`fn` may be a plain or an async function), polled every
    `every_s`; `AssertionError` naming `what` if none came within `timeout_s` (a generous bound, not a
    measurement: tests assert on the condition, never on how long it took). An exception of a type in
    `tolerate` counts as "not yet" (e.g. a process still starting that does not answer)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while loop.time() < deadline:
        try:
            result = fn()
            if inspect.isawaitable(result):
                result = await result
        except tolerate:
            result = None
        if result:
            return result
        await asyncio.sleep(every_s)
    raise AssertionError(f"{what} not reached within {timeout_s}s")



# What `tolerate` takes where a condition reads from engine hosts that are separate processes: a read from
# one still starting (or restarting) may fail in any way, which is "not yet".
STARTING: tuple[type[BaseException], ...] = (Exception,)
