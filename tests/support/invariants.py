"""Checks of DESIGN.md's fencing invariants against a session's whole log as stored in JetStream."""

from __future__ import annotations

import nats.js.errors

from libs import names
from libs.fence import core
from libs.schemas.base import decode
from libs.schemas.fence import Assign, Claim, LogRecord, Owner, Release


async def read_log(js, session_id: str) -> list[LogRecord]:
    records, pos = [], 1
    while True:
        try:
            raw = await js.get_msg(names.SESSION_STREAM, seq=pos, subject=names.session_log_subject(session_id), next=True,
                                   direct=True)
        except nats.js.errors.NotFoundError:
            return records
        records.append(decode(raw.data, LogRecord))
        pos = raw.seq + 1


def check_log(records: list[LogRecord]) -> dict[Owner, list[int]]:
    """Assert the invariants at every log position; return the item seqs released to each incarnation."""
    view = core.EMPTY
    version = 0
    released: dict[Owner, list[int]] = {}
    for record in records:
        event = record.event
        if isinstance(event, Assign):
            assert event.version == version + 1, "versions rise by one"
            version = event.version
        if isinstance(event, Claim):
            assert view.owner == Owner(server_id=event.server_id, version=event.version) and view.claim is None
        if isinstance(event, Release):
            to = Owner(server_id=event.server_id, version=event.version)
            assert core.current_owner(view) == to, "a release went to someone not the claimed owner"
            seqs = [i.seq for i in event.items]
            assert seqs == list(range(view.released + 1, view.released + 1 + len(seqs)))
            released.setdefault(to, []).extend(seqs)
        view = core.apply(view, event)
        assert view == record.view, "the stored view is the fold of the log"
    return released
