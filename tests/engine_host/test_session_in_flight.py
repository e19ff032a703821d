"""A session has at most one block in flight, and `idle` says exactly whether it has none (issue 22):
only `Session.block_started`, `block_finished` and `no_block_left` move it, whichever way the block
ends (through the sink, cancelled by a close, or the session failing)."""

from __future__ import annotations

import asyncio

from libs.schemas.engine import OpenSession
from services.engine_host.session import Session


def session() -> Session:
    return Session(spec=OpenSession(session_id="s", backend="toy", seed=1), backend=None,  # type: ignore[arg-type]
                   shape="", state={}, stats=None)  # type: ignore[arg-type]


async def test_a_block_runs_and_finishes_and_its_waiters_wake():
    s = session()
    assert s.idle.is_set() and not s.busy  # a new session has no block in flight
    assert s.block_started() == 0
    assert s.busy and not s.idle.is_set()
    advanced = asyncio.get_running_loop().create_future()
    s.waiters.append((1, advanced))
    s.blocks_done = 1
    s.block_finished(5.0)
    assert s.idle.is_set() and not s.busy and s.last_end == 5.0
    assert advanced.done()
    assert s.block_started() == 1  # the next block runs under the next pipeline sequence number


async def test_a_block_that_never_reaches_the_sink_leaves_the_session_idle():
    for status in (None, "failed"):
        s = session()
        s.block_started()
        s.no_block_left(status)
        assert s.idle.is_set() and not s.busy
        assert s.status == (status or "running")
