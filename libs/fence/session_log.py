"""The per-session ownership log on JetStream: read the tail, append with compare-and-set.

One stream (`names.SESSION_STREAM`) holds every session's log. A session's log is the
records matching `names.session_log_subject(sid)`; each record is stored on the subject
of the engine host it is addressed to (`core.addressee`), so an engine host reads one
subject filter for all its sessions. An append carries `Nats-Expected-Last-Subject-Sequence`
= the log position the caller decided on, checked against the session's whole log
(`Nats-Expected-Last-Subject-Sequence-Subject` = its filter, nats-server >= 2.11); the
server refuses it (JetStream error 10071) if anything of the session landed since. That
refusal is the only thing that decides a race, and `append` turns it into `Conflict`.
Reads are hints: a stale read just loses its append.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

from libs import bus, errors, names
from libs.fence import core
from libs.schemas.base import decode, encode
from libs.schemas.fence import Event, LogRecord, SessionView

EXPECTED_LAST_SUBJECT_SEQ = "Nats-Expected-Last-Subject-Sequence"
EXPECTED_LAST_SUBJECT_SEQ_SUBJECT = "Nats-Expected-Last-Subject-Sequence-Subject"
_SID = re.compile(r"[A-Za-z0-9_-]{1,128}")


def check_session_id(session_id: str) -> str:
    """Session ids become subject tokens and KV keys: letters, digits, `-` and `_` only.

    A full match: `re.match` with `$` would accept a trailing newline, which in a subject
    would end the NATS protocol line."""
    if not isinstance(session_id, str) or not _SID.fullmatch(session_id):
        raise errors.BadRequest("session_id must be 1-128 of [A-Za-z0-9_-]", session_id=str(session_id)[:140])
    return session_id


def check_server_id(server_id: str) -> str:
    """Server ids become subject tokens of the log (`names.session_record_subject`): the same rule."""
    if not isinstance(server_id, str) or not _SID.fullmatch(server_id):
        raise errors.BadRequest("server_id must be 1-128 of [A-Za-z0-9_-]", server_id=str(server_id)[:140])
    return server_id


@dataclass(frozen=True, slots=True)
class Retention:
    """How much the fence's streams and buckets may hold (-1: no limit; see docs/configuration.md).
    Full, they refuse new writes; only the input stream also ages out (`input_max_age_s`)."""

    log_max_bytes: int = -1
    input_max_bytes: int = -1
    input_max_age_s: float | None = None
    meta_max_bytes: int = -1


async def provision(js: bus.JetStream, replicas: int = 1, retention: Retention = Retention()) -> None:
    """Create the fence's streams and buckets (idempotent)."""
    r = retention
    await bus.ensure_stream(js, bus.StreamSpec(names.SESSION_STREAM, [names.SESSION_LOG_SUBJECTS],
                                               replicas=replicas, max_bytes=r.log_max_bytes))
    await bus.ensure_stream(js, bus.StreamSpec(names.INPUT_STREAM, [names.INPUT_SUBJECTS], replicas=replicas,
                                               max_bytes=r.input_max_bytes, max_age_s=r.input_max_age_s))
    await bus.ensure_stream(js, bus.StreamSpec(names.BLOCK_STREAM, [names.BLOCK_JOURNAL_SUBJECTS],
                                               replicas=replicas, max_bytes=r.log_max_bytes))
    await bus.ensure_kv(js, names.FENCE_META_BUCKET, replicas=replicas, max_bytes=r.meta_max_bytes)
    await bus.ensure_kv(js, names.SESSIONS_BUCKET, replicas=replicas, max_bytes=r.meta_max_bytes)


@dataclass(frozen=True, slots=True)
class Tail:
    """The view at a log position (`seq` 0 = the session's log is empty)."""

    view: SessionView
    seq: int


async def read_tail(js: bus.JetStream, session_id: str) -> Tail:
    raw = await bus.last_msg(js, names.SESSION_STREAM, names.session_log_subject(session_id),
                                   what="the session log", session_id=session_id)
    if raw is None:
        return Tail(core.EMPTY, 0)
    return Tail(decode(raw.data, LogRecord).view, raw.seq)


async def append(js: bus.JetStream, session_id: str, tail: Tail, event: Event) -> Tail:
    """Append `event` if the log is still at `tail`; raise `Conflict` if it moved. Returns the new tail."""
    view = core.apply(tail.view, event)
    record = LogRecord(event=event, view=view, at=time.time())
    host = core.addressee(tail.view, event)
    subject = names.session_record_subject(session_id, names.NO_HOST if host is None else check_server_id(host))
    # Unavailable: the append may or may not have landed; the caller re-reads the tail and decides again.
    seq = await bus.append(js, subject, encode(record), {
        EXPECTED_LAST_SUBJECT_SEQ: str(tail.seq),
        EXPECTED_LAST_SUBJECT_SEQ_SUBJECT: names.session_log_subject(session_id)},
        what="the session log", session_id=session_id, expected=tail.seq)
    return Tail(view, seq)
