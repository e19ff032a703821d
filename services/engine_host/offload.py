"""Suspend and resume: an idle session's state moves to host memory (pinned where there is a GPU)
and back, at a block boundary; a suspended session takes input but runs no blocks."""

from __future__ import annotations

from collections.abc import Callable

import torch

from libs.checkpoint import clone_tree
from libs.errors import Conflict
from services.engine_host.boundary import Boundaries
from services.engine_host.lifecycle import InThread
from services.engine_host.scheduler import EdfScheduler
from services.engine_host.session import SessionTable


class Offload:
    def __init__(self, sessions: SessionTable, boundaries: Boundaries, sched: EdfScheduler, device: torch.device,
                 *, in_thread: InThread, clock: Callable[[], float]) -> None:
        self.sessions = sessions
        self.boundaries = boundaries
        self.sched = sched
        self.device = device
        self.in_thread = in_thread
        self.clock = clock

    async def suspend(self, sid: str, hold_share: bool = False) -> None:
        s = self.sessions.get(sid)
        if s.status != "running":
            raise Conflict(f"session {sid} is {s.status}, not running", session_id=sid)
        async with self.boundaries.hold(s):
            pin = self.device.type == "cuda"
            s.state = await self.in_thread(clone_tree, s.state, "cpu", pin=pin)
            s.status, s.suspended_at, s.holds_share = "suspended", self.clock(), hold_share
            self.sched.pause(sid, True, s.suspended_at)

    async def resume(self, sid: str) -> None:
        s = self.sessions.get(sid)
        if s.status != "suspended":
            raise Conflict(f"session {sid} is {s.status}, not suspended", session_id=sid)
        async with self.boundaries.hold(s):
            s.state = await self.in_thread(clone_tree, s.state, self.device)
            now = self.clock()
            s.stats.idle_interval(s.suspended_at, now, "suspended")
            s.status, s.last_end, s.holds_share = "running", now, False
