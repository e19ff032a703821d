"""Background tasks whose death is never silent.

A loop that owns work (a dispatcher, a watcher, a consumer) and dies without a
word leaves a process that looks alive but does nothing; every such task gets
this done-callback.
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
            out.error(event, task=task.get_name(), error=repr(task.exception()))

    return done


def spawn(coro, *, name: str, event: str = "background_task_failed") -> asyncio.Task:
    """Start a task whose crash is logged as `event`."""
    task = asyncio.create_task(coro, name=name)
    task.add_done_callback(report_death(event))
    return task
