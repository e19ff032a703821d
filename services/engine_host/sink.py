"""The output sink: the end of the stage pipeline, on the event loop. Each finished block advances
its session's progress, is accounted, and its output is published to the session's output subject
(a fenced session's through its journal: recorded first, see journal.py; any other's through its
outbox, outbox.py: both publish in block order off the block's critical path); a block that raised
fails its session instead. An input item the backend refused is reported on the same subject (an
`input_rejected` chunk), so the client that sent it hears why it had no effect."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable

import msgspec
import structlog

from libs import errors, names
from libs.schemas.base import encode
from libs.schemas.engine import OutputChunk
from libs.schemas.fence import ConsumedBlock
from libs.telemetry import counter
from services.engine_host import output as wire
from services.engine_host.backends import Output
from services.engine_host.backends.base import block_media_s
from services.engine_host.costs import CostModel
from services.engine_host.device_time import DeviceTime
from services.engine_host.journal import Finished
from services.engine_host.outbox import Outbox
from services.engine_host.session import Rejected, Session
from services.engine_host.stages import BlockJob, BlockWork

log = structlog.get_logger("statefleet.engine_host.sink")
_output_dropped = counter("sf_engine_output_dropped_total", "Output chunks the bus did not take")
_inputs_rejected = counter("sf_engine_inputs_rejected_total", "Input items a backend refused (skipped)")

Publish = Callable[[str, bytes], Awaitable[None]]

# Blocks a session may have waiting for its journal (an outage) or outbox before the sink waits for it.
MAX_JOURNAL_BACKLOG = 64


class OutputSink:
    def __init__(self, publish: Publish | None, costs: CostModel, *, fail: Callable[[Session, BaseException], None],
                 clock: Callable[[], float]) -> None:
        self.publish = publish
        self.costs = costs
        self.fail = fail
        self.clock = clock
        self.device_time = DeviceTime()

    async def take(self, work: BlockWork) -> None:
        """Account every block of a work that came through the stages; learn the quantum's cost."""
        now = self.clock()
        self.device_time.add(now, sum(work.stage_ms.values()) / 1000)
        for it in work.items:
            if it.error is not None:
                self.fail(it.data.session, it.error)
                continue
            await self.block_done(it.data, now, work.stage_ms)
        if work.items and all(it.error is None for it in work.items):
            self.costs.learn(work.items[0].data.session.shape, work.meta.tier, len(work.items),
                             sum(work.stage_ms.values()) / 1000)

    async def block_done(self, job: BlockJob, now: float, stage_ms: dict[str, float]) -> None:
        """One block of a session is done: its state has advanced past `job.last_seq`. Counted,
        published, and only then does the session count as idle again."""
        s = job.session
        consumed = ConsumedBlock(block=s.blocks_done + 1, first_seq=s.consumed_seq + 1, last_seq=job.last_seq,
                                 tier=job.tier)
        s.stats.output(now, job.accepted_at, stage_ms)
        s.blocks_done += 1
        s.consumed_seq = job.last_seq
        if s.journal is not None:
            s.journal.add(Finished(consumed, job.output, job.replayed, job.release))
            if s.journal.backlog >= MAX_JOURNAL_BACKLOG:
                await s.journal.flushed()
        elif job.output is not None and self.publish is None:
            await self.publish_block(s, s.blocks_done, job.output, False, job.last_seq)  # only counted
        elif job.output is not None:
            if s.outbox is None:
                s.outbox = Outbox(s.sid, functools.partial(self.publish_block, s))
            s.outbox.add(s.blocks_done, job.output, job.last_seq)
            if s.outbox.backlog >= MAX_JOURNAL_BACKLOG:
                await s.outbox.flushed()
        s.block_finished(now)

    async def publish_block(self, s: Session, block: int, output: Output, replayed: bool, input_seq: int,
                            release: float | None = None) -> None:
        """Output is a stream for a live viewer: a chunk the bus cannot take is dropped and counted,
        never allowed to stop the session (its state already advanced) or the sink. A C1 block with
        its `release` (passed only from the session's own journal task, which may wait) is held to
        its playout point (playout.py)."""
        media_s = block_media_s(s.backend, block - 1)
        if self.publish is None:
            s.stats.published(self.clock(), media_s)
            return
        # PNG encoding is host-side work, not the device's: it runs in a thread here, after the block's
        # stages, so it neither holds the event loop nor counts in the quantum cost the scheduler learns.
        encoded = await asyncio.to_thread(wire.encode, output)
        if release is not None and s.playout is not None:
            ready = self.clock()
            hold = s.playout.point(release, ready) - ready
            s.stats.held(hold)
            if hold > 0:
                await asyncio.sleep(hold)
        s.stats.published(self.clock(), media_s)
        try:
            for chunk in wire.chunks(s.sid, block, encoded, media_s=s.backend.media_s_per_block,
                                     input_seq=input_seq, replayed=replayed):
                await self.publish(names.output_subject(s.sid), encode(chunk))
        except errors.Unavailable as e:  # live output is at most once: a block the bus did not take is dropped
            _output_dropped.add(1, {"reason": e.fields.get("reason", e.code)})
            log.warning("output_dropped", session_id=s.sid, block=block, error=e.detail)

    async def report_rejected(self, s: Session, rejected: Rejected) -> None:
        """An item the backend refused was skipped: say so on the session's output stream."""
        e = rejected.error
        _inputs_rejected.add(1, {"backend": s.spec.backend, "code": e.code})
        log.info("input_rejected", session_id=s.sid, seq=rejected.seq, code=e.code, detail=e.detail)
        if self.publish is None:
            return
        body = {"type": f"urn:statefleet:error:{e.code}", "title": e.code, "status": e.http_status,
                "detail": e.detail, "code": e.code, "seq": rejected.seq}
        chunk = OutputChunk(session_id=s.sid, block=s.blocks_done, kind="input_rejected", dtype="json", shape=[],
                            part=0, parts=1, data=msgspec.json.encode(body))
        try:
            await self.publish(names.output_subject(s.sid), encode(chunk))
        except errors.Unavailable as err:
            _output_dropped.add(1, {"reason": err.fields.get("reason", err.code)})
