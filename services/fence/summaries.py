"""The `sf_sessions` hint (`SessionSummary`, what `statefleet status` shows), written by fence only.

Fence writes a session's first summary as it registers it, a fresh one after each append it makes to
the log, and placement's marks (orphaned, suspended to relieve a device, resumed after that), which
placement asks for with `sf.fence.mark`: so the hint has one writer, and `libs/bus_auth.py` lets only
fence put into it. A summary is a display hint, never authority; failing to write one only costs
freshness. A shed or resumed mark, and an orphan mark on a session not orphaned already, is also told to
the session's client as a `SessionNotice`.
"""

from __future__ import annotations

import time

import structlog

from libs import bus, errors, names
from libs.fence import core, session_log
from libs.schemas.base import decode, encode
from libs.schemas.common import NoticeKind, SessionNotice, SessionSummary
from libs.schemas.fence import MarkReply, MarkRequest, SessionView

_log = structlog.get_logger("statefleet.fence.summaries")


async def first_summary(js: bus.JetStream, session_id: str, *, backend: str, session_class: str) -> None:
    """A session's first summary, as fence registers it: the hint names its backend and class from then on."""
    kv = await js.key_value(names.SESSIONS_BUCKET)
    await kv.put(session_id, encode(SessionSummary(session_id=session_id, backend=backend,
                                                   session_class=session_class, state="pending",
                                                   updated_at=time.time())))


async def update_summary(js: bus.JetStream, session_id: str, view: SessionView, **fields: str) -> tuple[str, str]:
    """Refresh the session's summary from the log's `view` (`fields` override it: a state and its
    reason); the state it had and the state written ("" when the write failed)."""
    before = ""
    try:
        kv = await js.key_value(names.SESSIONS_BUCKET)
        summary = await _read(kv, session_id)
        before = summary.state
        owner = view.owner
        summary.owner_server_id = owner.server_id if owner else ""
        summary.owner_version = owner.version if owner else 0
        summary.claimed = core.current_owner(view) is not None
        summary.owner_incarnation = view.incarnation
        summary.state = "closed" if view.closed else ("serving" if summary.claimed else
                                                       "assigned" if owner else "pending")
        summary.reason = summary.shed = ""  # a state's reason is the writer's to give with it
        for key, value in fields.items():
            setattr(summary, key, value)
        summary.updated_at = time.time()
        await kv.put(session_id, encode(summary))
        return before, summary.state
    except Exception as e:  # a hint: whatever failed, the log is unchanged and the next update rewrites it
        _log.warning("session_summary_failed", session_id=session_id, error=str(e) or type(e).__name__)
        return before, ""


async def _read(kv: bus.KeyValue, session_id: str) -> SessionSummary:
    """The summary as it stands; a fresh one when there is none or it does not decode (it is rewritten)."""
    entry = await bus.kv_read(kv, session_id)
    try:
        return decode(entry.value or b"", SessionSummary) if entry is not None else SessionSummary(session_id=session_id)
    except errors.SchemaError:
        return SessionSummary(session_id=session_id)


async def mark(nc: bus.Client, js: bus.JetStream, req: MarkRequest) -> MarkReply:
    """`sf.fence.mark`: placement's word on the session at owner version `req.version`: no room for it
    (orphaned), suspended to relieve its device (shed), or back on a device after that (resumed). Marked
    only while the log still shows that version, open: a session reassigned or closed since placement
    looked is summarized as the log shows it, so a late mark never hides a newer owner. A shed or resumed
    mark that holds is told to the session's client (`SessionNotice` on `sf.notice.<sid>`), and so is an
    orphan mark that makes the session orphaned: once, not again at each sweep that finds the hosts'
    reasons changed (the summary keeps the latest)."""
    view = (await session_log.read_tail(js, session_log.check_session_id(req.session_id))).view
    version = view.owner.version if view.owner else 0
    current = version == req.version and not view.closed
    notice: NoticeKind | None = None
    if current and req.orphaned:
        before, state = await update_summary(js, req.session_id, view, state="orphaned", reason=req.orphaned)
        notice = "orphaned" if state == "orphaned" and before != "orphaned" else None
    elif current and req.shed:
        _, state = await update_summary(js, req.session_id, view, state="suspended", reason=req.shed,
                                        shed=req.shed_kind)
        notice = req.shed_kind or None
    else:
        _, state = await update_summary(js, req.session_id, view)
        notice = "resumed" if current and req.resumed else None
    if notice is not None:
        try:  # a live event: viewers connected now hear it; the summary keeps the mark for everyone else
            await bus.publish(nc, names.notice_subject(req.session_id), encode(SessionNotice(
                session_id=req.session_id, kind=notice, reason=req.orphaned or req.shed, at=time.time())))
        except errors.StatefleetError as e:
            _log.warning("session_notice_failed", session_id=req.session_id, kind=notice, code=e.code)
    return MarkReply(session_id=req.session_id, state=state)
