"""An engine host's feed: one ordered consumer on every session-log record addressed to the host.

Every record a lease needs — its claim, the releases to it, the assign or close that revokes
it — is stored on the host's token of the session's log (`core.addressee`), so one consumer per
host serves all the leases it holds: the server's consumer count follows hosts, not sessions.
The feed only carries records, in stream order and without gaps (the ordered consumer starts
over after the last record it delivered when it misses one or loses its heartbeats); what a
record means to a lease, each lease decides by its position and its `(server_id, version)`.
"""

from __future__ import annotations

from collections.abc import Callable

import structlog

from libs import bus, errors, names
from libs.schemas.base import decode
from libs.schemas.fence import LogRecord
from libs.telemetry import counter

# Missed heartbeats tell the ordered consumer it was lost (a NATS restart, a leader election).
FEED_HEARTBEAT_S = 1.0
_log = structlog.get_logger("statefleet.fence.feed")
_malformed = counter("sf_engine_feed_records_malformed_total", "Session-log records an engine's feed skipped")

Deliver = Callable[[str, int, LogRecord], None]


class HostFeed:
    """Calls `deliver(session_id, log_position, record)` for each record addressed to `host_id`."""

    def __init__(self, js: bus.JetStream, host_id: str, deliver: Deliver) -> None:
        self.js, self.host_id, self._deliver = js, host_id, deliver
        self._sub = None

    async def start(self) -> None:
        """Read from the stream's next record on: what came before belongs to no lease of this process.
        `Unavailable` when the stream cannot be reached now (the caller retries)."""
        with bus.unavailable("host feed not started", host_id=self.host_id):
            start = (await self.js.stream_info(names.SESSION_STREAM)).state.last_seq + 1
            config = bus.ConsumerConfig(deliver_policy=bus.DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=start)
            sub = await self.js.subscribe(names.host_records_subject(self.host_id), cb=self._on_msg,
                                          ordered_consumer=True, config=config, stream=names.SESSION_STREAM,
                                          idle_heartbeat=FEED_HEARTBEAT_S)
        # nats-py restarts an ordered consumer after the last record it delivered, and before the first
        # one from the stream's very first record: have it resume where we started instead, so a restart
        # before any delivery does not read the host's whole history again (the leases would skip it).
        jsi = getattr(getattr(sub, "_sub", None), "_jsi", None)
        if jsi is not None and getattr(jsi, "_sseq", None) == 0:
            jsi._sseq = start - 1
        self._sub = sub

    async def stop(self) -> None:
        sub, self._sub = self._sub, None
        if sub is not None:
            await bus.quietly(sub.unsubscribe())

    async def _on_msg(self, msg) -> None:
        try:
            record = decode(msg.data, LogRecord)
        except errors.StatefleetError as e:  # fence never writes one; whoever did, it carries nothing for us
            _malformed.add(1)
            _log.error("feed_record_undecodable", subject=msg.subject, error=repr(e))
            return
        self._deliver(names.record_session_id(msg.subject), msg.metadata.sequence.stream, record)
