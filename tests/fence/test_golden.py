"""Golden replay of a recorded session log (assign, claim, releases, failover with re-release, close).

The file holds the exact bytes the fence wrote. Today's code must decode every record, fold them
to the same views, re-encode them to the same document (fields added since the recording may only
appear at their defaults), and refuse what the recorded log refused.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from libs.errors import Conflict
from libs.fence import core
from libs.schemas.base import decode, encode
from libs.schemas.fence import Close, LogRecord, Owner, Release

GOLDEN = Path(__file__).parent / "golden" / "session_log.msgpack"


def test_recorded_log_replays_exactly():
    raw = msgspec.msgpack.decode(GOLDEN.read_bytes())
    view = core.EMPTY
    delivered: dict[Owner, list[int]] = {}
    for data in raw:
        record = decode(data, LogRecord)
        assert same_document(msgspec.msgpack.decode(data), msgspec.msgpack.decode(encode(record)))
        view = core.apply(view, record.event)
        assert view == record.view
        if isinstance(record.event, Release):
            to = Owner(server_id=record.event.server_id, version=record.event.version)
            delivered.setdefault(to, []).extend(i.seq for i in record.event.items)
    assert isinstance(record.event, Close) and view.closed
    # host-a got 1..3 and lost the session; host-b resumed from its checkpoint at 1 and got 2..4.
    assert delivered == {Owner(server_id="host-a", version=1): [1, 2, 3],
                         Owner(server_id="host-b", version=2): [2, 3, 4]}


def same_document(old, new) -> bool:
    """`new` says what `old` said; keys it adds (schema evolution: new fields get defaults) are at a default."""
    if isinstance(old, dict) and isinstance(new, dict):
        added = new.keys() - old.keys()
        return (all(k in new and same_document(v, new[k]) for k, v in old.items())
                and all(new[k] in ("", 0, None, [], False) for k in added))
    if isinstance(old, list) and isinstance(new, list):
        return len(old) == len(new) and all(same_document(a, b) for a, b in zip(old, new, strict=True))
    return old == new


def test_recorded_log_refuses_what_it_should():
    views = [decode(d, LogRecord).view for d in msgspec.msgpack.decode(GOLDEN.read_bytes())]
    after_failover = views[4]  # assign to host-b, unclaimed
    with pytest.raises(Conflict):
        core.decide_claim(after_failover, "host-a", 1, 3)  # the revoked owner's late claim
    with pytest.raises(Conflict):
        core.decide_release(after_failover, Owner(server_id="host-a", version=1), [], 0)
    assert core.revoked(Owner(server_id="host-a", version=1), after_failover)
