"""Checkpoint and restore: a session's state at a block boundary, kept in the checkpoint store so a
replacement host can restore it (failover) instead of replaying from the seed."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable

import torch

from libs.checkpoint import CheckpointStore, clone_tree
from libs.errors import ConfigError, Conflict, NotFound
from libs.schemas.base import encode
from libs.schemas.engine import CheckpointRef
from services.engine_host.backends.spec import select
from services.engine_host.boundary import Boundaries
from services.engine_host.host_endpoint import describe
from services.engine_host.lifecycle import InThread
from services.engine_host.scheduler import Task
from services.engine_host.session import Session, SessionTable

Install = Callable[..., Awaitable[Session]]  # (sid, tree, descriptor, *, gated) -> the installed session


class Snapshots:
    def __init__(self, store: CheckpointStore | None, sessions: SessionTable, boundaries: Boundaries,
                 tasks: Callable[[str], Task | None], device: torch.device, *, install: Install,
                 in_thread: InThread) -> None:
        self.store = store
        self.device = device
        self.sessions = sessions
        self.boundaries = boundaries
        self.tasks = tasks
        self.install = install
        self.in_thread = in_thread

    def _store(self) -> CheckpointStore:
        if self.store is None:
            raise ConfigError("this host has no checkpoint store configured", host_id=self.sessions.host_id)
        return self.store

    async def checkpoint(self, sid: str, *, delete_previous: bool) -> CheckpointRef:
        """Snapshot the session at a block boundary into the checkpoint store; the previous checkpoint
        of the session is deleted once the new one is committed, unless the caller still has to
        record the new one elsewhere first (`delete_previous=False`)."""
        store = self._store()
        s = self.sessions.get(sid)
        async with self.boundaries.hold(s):
            if s.journal is not None and s.journal.fenced.is_set():
                # A newer owner sealed the journal: this copy may hold blocks it could not record, and a
                # checkpoint of them (fence can still take it, racing the new assign) would be restored
                # by a later replacement as history that never was.
                raise Conflict(f"session {sid} is fenced here: its state is not the journal's", session_id=sid)
            # Only the moved leaves: a restore regenerates the others as a move's install does.
            snapshot = await self.in_thread(clone_tree, select(s.state, s.backend.state_spec()), "cpu")
            desc = describe(s, self.tasks(sid), with_pending=False)
            key = f"{sid}.b{s.blocks_done}"
        m = await store.put(key, snapshot, encode(desc), copy=False)
        previous, s.checkpoint_key = s.checkpoint_key, key
        if delete_previous and previous and previous != key:
            await self.delete(previous)
        return CheckpointRef(session_id=sid, key=key, location=m.location, total_bytes=m.total_bytes,
                             blocks_done=desc.blocks_done, consumed_seq=desc.consumed_seq)

    async def restore(self, sid: str, key: str, *, gated: bool = False) -> None:
        """Create the session from a checkpoint; input resumes after its consumed cursor. The checkpoint's
        descriptor says which block it captured (`blocks_done`): a replacement regenerates those after it."""
        store = self._store()
        if sid in self.sessions:
            raise Conflict(f"session {sid} is already open on {self.sessions.host_id}", session_id=sid)
        tree, desc = await store.get(key, self.device)
        s = await self.install(sid, tree, desc, gated=gated)
        s.checkpoint_key = key

    async def delete(self, key: str) -> None:
        """Drop a checkpoint no one points at any more; one already gone is fine."""
        with contextlib.suppress(NotFound):
            await self._store().delete(key)
