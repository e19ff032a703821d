"""Background tasks whose death is never silent, and whose cancellation is never lost.

A loop that owns work (a dispatcher, a watcher, a consumer) and dies without a
word leaves a process that looks alive but does nothing; every such task gets
this done-callback.

The opposite failure: on Python 3.11, `asyncio.wait_for` returns the inner result
instead of raising when a cancellation meets the inner awaitable's completion in
one loop turn (CPython gh-86296, fixed in 3.12), and nats-py waits through it in
every request and watch. A loop whose cancellation was lost outlives its owner: a
stopped service keeps acting, and whoever awaits the loop hangs. So our loops wait
with `asyncio.timeout` (`wait_set`), and owners stop tasks with `cancel_and_wait`,
which cancels again until they end.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import structlog

_log = structlog.get_logger("statefleet.tasks")


def report_death(event: str, logger: structlog.typing.FilteringBoundLogger | None = None,
                 ) -> Callable[[asyncio.Task], None]:
    """A done-callback that logs `event` with the task's name and error when the task raised."""
    out = logger or _log

    def done(task: asyncio.Task) -> None:
        if not task.cancelled() and task.exception() is not None:
            out.error(event, task=task.get_name(), error=repr(task.exception()), exc_info=task.exception())

    return done


async def wait_set(event: asyncio.Event, timeout_s: float) -> bool:
    """Wait until `event` is set or `timeout_s` passed; whether it is set. A cancellation always
    propagates (unlike `asyncio.wait_for` on 3.11, see the module doc)."""
    try:
        async with asyncio.timeout(timeout_s):
            await event.wait()
    except TimeoutError:
        pass
    return event.is_set()


# How often a task that is still running after `cancel()` is cancelled again.
RECANCEL_S = 0.05
# How long an owner waits for its loops to end once cancelled, before it logs them and goes on.
STOP_TIMEOUT_S = 10.0


async def cancel_and_wait(tasks, *, timeout_s: float) -> list[asyncio.Task]:
    """Cancel `tasks` and wait for them to end, cancelling again any that keep running (a
    cancellation lost inside a third-party `wait_for`); returns those still running at `timeout_s`."""
    pending = {t for t in tasks if not t.done()}
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while pending:
        for t in pending:
            t.cancel()
        left = deadline - loop.time()
        if left <= 0:
            break
        _, pending = await asyncio.wait(pending, timeout=min(RECANCEL_S, left))
    for t in pending:
        _log.error("task_outlived_cancel", task=t.get_name(), timeout_s=timeout_s)
    return list(pending)


def spawn(coro, *, name: str, event: str = "background_task_failed") -> asyncio.Task:
    """Start a task whose crash is logged as `event`."""
    task = asyncio.create_task(coro, name=name)
    task.add_done_callback(report_death(event))
    return task
