"""A replacement installs the newest checkpoint, even one recorded after it read the meta (issue 22).

The invariant: the state a replacement serves from is at least the checkpoint fence records at the
moment its claim lands. A presumed-dead owner keeps its claim until the replacement's lands, so it can
record a newer checkpoint between the replacement's meta read and its claim, and then purge its block
journal up to it: installing the older checkpoint would leave the blocks between the two unreplayable.
A mutation campaign made the replacement ignore that newer checkpoint and no test noticed; this one
was seen failing against that violation (the catch-up in `Assignments._take_journal` skipped).

The engine host's `Assignments` runs for real against fence on a real nats-server; only the runtime
under it is a small recording host, so the test can record the old owner's checkpoint exactly inside
that window (when the replacement restores the one it read).
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

import msgspec

from libs import bus, names
from libs.contracts import Contract
from libs.fence import session_log
from libs.fence.block_journal import BlockJournal
from libs.fence.client import EngineClient
from libs.fence.ownership import assign, read_owner
from libs.schemas.common import InputItem
from libs.schemas.engine import CheckpointRef, OpenSession, SessionInfo
from libs.schemas.fence import ConsumedBlock, MetaRequest, RegisterReply, RegisterRequest, SessionMeta
from services.engine_host.assignments import Assignments
from services.engine_host.journal import OutputJournal
from services.fence import sessions as sessions_module
from tests.support.waiting import eventually

CONTRACT = Contract(session_class="C1", quality_floor=1, determinism="T1", period_ms=50.0)


@dataclass
class RecordingHost:
    """A runtime that holds one session as (checkpoint it came from, blocks done, input cursor);
    `on_restore` runs when a restore starts, before the restored state is installed."""

    checkpoints: dict[str, tuple[int, int]]  # key -> (blocks_done, cursor)
    on_restore: object = None
    installed: dict[str, tuple[str, int, int]] = field(default_factory=dict)  # sid -> (key, blocks, cursor)
    gated: set[str] = field(default_factory=set)
    ungated_at: dict[str, tuple[str, int, int]] = field(default_factory=dict)  # state when first ungated
    journals: list[OutputJournal] = field(default_factory=list)

    def holds(self, sid: str) -> bool:
        return sid in self.installed

    def moved_in(self) -> set[str]:
        return set()

    def info(self, sid: str) -> SessionInfo:
        _, blocks, cursor = self.installed[sid]
        return SessionInfo(session_id=sid, backend="toy", state="running", session_class="C1", tier=1,
                           blocks_done=blocks, input_cursor=cursor, consumed_seq=cursor, state_bytes=0)

    async def open(self, spec: OpenSession, *, gated: bool = False) -> SessionInfo:
        self.installed[spec.session_id] = ("seed", 0, 0)
        self._gate(spec.session_id, gated)
        return self.info(spec.session_id)

    async def restore(self, sid: str, key: str, *, gated: bool = False) -> SessionInfo:
        if self.on_restore is not None:
            hook, self.on_restore = self.on_restore, None
            await hook()  # type: ignore[operator]
        blocks, cursor = self.checkpoints[key]
        self.installed[sid] = (key, blocks, cursor)
        self._gate(sid, gated)
        return self.info(sid)

    def _gate(self, sid: str, gated: bool) -> None:
        if gated:
            self.gated.add(sid)

    def gate(self, sid: str) -> None:
        self.gated.add(sid)

    def ungate(self, sid: str) -> None:
        self.gated.discard(sid)
        self.ungated_at.setdefault(sid, self.installed[sid])

    def attach_journal(self, sid: str, writer: BlockJournal) -> OutputJournal:
        async def publish(*_args) -> None:
            return None

        journal = OutputJournal(writer, publish)
        self.journals.append(journal)
        return journal

    async def replay_block(self, sid: str, block: ConsumedBlock) -> None:
        key, _, cursor = self.installed[sid]
        self.installed[sid] = (key, block.block, max(cursor, block.last_seq))

    async def apply_input(self, item: InputItem) -> int:
        key, blocks, _ = self.installed[item.session_id]
        self.installed[item.session_id] = (key, blocks, item.seq)
        return item.seq

    async def checkpoint(self, sid: str, *, delete_previous: bool = True) -> CheckpointRef:
        raise AssertionError("the test's checkpoint period is never reached")

    async def delete_checkpoint(self, key: str) -> None:
        return None

    async def close(self, sid: str, *, finish: bool = True) -> SessionInfo:
        info = self.info(sid)
        del self.installed[sid]
        self.gated.discard(sid)
        return info


class StaleTail:
    """Fence's view of the session log as it was when a request read it, before a later record."""

    def __init__(self, tail: session_log.Tail) -> None:
        self.tail = tail

    def __getattr__(self, name: str):
        return getattr(session_log, name)

    async def read_tail(self, js, session_id: str) -> session_log.Tail:
        return self.tail


async def test_a_checkpoint_recorded_between_the_meta_read_and_the_claim_is_installed(nc, fence, monkeypatch):
    sid = "catch-up"
    js = nc.jetstream()
    await bus.request(nc, names.FENCE_REGISTER, RegisterRequest(
        session_id=sid, backend="toy", seed=3, contract=msgspec.msgpack.encode(CONTRACT), tier=1), RegisterReply)
    old = EngineClient(nc, js, "A")
    await old.start()
    new = EngineClient(nc, js, "B")
    await new.start()
    try:
        await assign(nc, sid, "A")
        await old.claim(sid, 1, 0)
        await old.checkpoint(sid, 1, "ck-5", cursor=5, block=5)

        before_failover = await session_log.read_tail(js, sid)

        async def old_owner_runs_on() -> None:
            # The replacement has read the meta (it restores "ck-5") and not claimed yet. The old
            # owner, presumed dead but running, asked to record "ck-9" just before the failover's
            # assign landed: fence found it the claimed owner then, and its meta write lands now.
            with monkeypatch.context() as patch:
                patch.setattr(sessions_module, "session_log", StaleTail(before_failover))
                await old.checkpoint(sid, 1, "ck-9", cursor=9, block=9)

        host = RecordingHost(checkpoints={"ck-5": (5, 5), "ck-9": (9, 9)}, on_restore=old_owner_runs_on)
        replacement = Assignments(new, host, checkpoint_every_s=3600.0, orphan_grace_s=3600.0)
        running = asyncio.create_task(replacement.run())
        try:
            await assign(nc, sid, "B")  # the failover: fence assigns the session to B

            async def served() -> bool:
                view = (await read_owner(js, sid)).view
                return view.claim is not None and view.claim.server_id == "B" and sid in host.ungated_at

            await eventually(served, what="B claimed and serving")
            meta = await bus.request(nc, names.FENCE_META, MetaRequest(session_id=sid), SessionMeta)
            assert meta.checkpoint_ref == "ck-9"
            # B never served from behind the checkpoint fence recorded when its claim landed.
            assert host.ungated_at[sid] == ("ck-9", 9, 9)
            assert host.installed[sid][:2] == ("ck-9", 9)
        finally:
            running.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await running
            await replacement.stop()
            for journal in host.journals:
                await journal.close()
    finally:
        await old.close()
