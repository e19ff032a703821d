"""Retrying a bus call that fails retryably, until a deadline."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from libs import errors
from libs.bus.failures import typed_error

R = TypeVar("R")


async def retry_transient(attempt: Callable[[], Awaitable[R]], deadline: float,
                          on_retry: Callable[[errors.StatefleetError], None]) -> R:
    """`await attempt()`, retried with backoff while it fails retryably and the monotonic `deadline`
    allows; the last failure (or any other) surfaces as a typed error."""
    pause = 0.05
    while True:
        try:
            return await attempt()
        except Exception as e:
            error = typed_error(e)
            if error is None:
                raise
            if not error.retryable or time.monotonic() + pause > deadline:
                if error is e:
                    raise
                raise error from e
            on_retry(error)
            await asyncio.sleep(pause)
            pause = min(2 * pause, 2.0)
