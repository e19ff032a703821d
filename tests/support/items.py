"""Input items as fence delivers them, built for backend tests (issue 22: shared from here, not from a test
module)."""

from __future__ import annotations

import json

from libs.schemas.common import InputItem


def item(kind: str, value, seq: int = 1) -> InputItem:
    return InputItem(session_id="s", seq=seq, kind=kind, data=json.dumps(value).encode())
