"""A session's notices (`SessionNotice` on `sf.notice.<sid>`) as its viewers get them: one JSON text message,
`{"notice": {"session_id", "kind", "reason", "at"}}`, on the output WebSocket (egress.py) and on a WebRTC
viewer's data channel (rtc_peer.py) alike. Fence publishes them as it marks the summary (summaries.py)."""

from __future__ import annotations

import msgspec

from libs import errors
from libs.schemas.base import decode
from libs.schemas.common import SessionNotice


def notice_text(data: bytes) -> str | None:
    """The viewer's message for one published notice; None for one that does not decode (dropped)."""
    try:
        notice = decode(data, SessionNotice)
    except errors.SchemaError:
        return None
    return msgspec.json.encode({"notice": notice}).decode()
