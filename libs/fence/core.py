"""The pure decision core of fencing: every ownership decision, with no I/O.

The service, the engine-side client and the race harness (`bench.fence_race`) all
call these functions. A decision is made against a `SessionView` folded from the
log; the shell then appends the resulting event with a compare-and-set on the
log position it read, so the decision holds at the moment it lands.

`protocol` selects what identifies an owner: "full" compares `(server_id,
version)`; "id_only" compares the server id alone. Only "full" is used in
production; "id_only" exists so the race harness can show what the version buys.
"""

from __future__ import annotations

from typing import Literal

from libs.errors import BadRequest, Conflict
from libs.schemas.common import InputItem
from libs.schemas.fence import Assign, Claim, Close, Event, Owner, Release, SessionView

Protocol = Literal["full", "id_only"]
EMPTY = SessionView()


def same(a: Owner | None, b: Owner | None, protocol: Protocol = "full") -> bool:
    """Whether two incarnations count as the same owner under `protocol`."""
    if a is None or b is None:
        return False
    return a == b if protocol == "full" else a.server_id == b.server_id


def current_owner(view: SessionView, protocol: Protocol = "full") -> Owner | None:
    """The claimed owner that may take input now, or None while unassigned, unclaimed or closed."""
    if view.closed or not same(view.claim, view.owner, protocol):
        return None
    return view.claim


def authorized(me: Owner, view: SessionView, protocol: Protocol = "full") -> bool:
    """Whether `me` may take input at this log position (what an engine concludes from the log)."""
    return same(me, current_owner(view, protocol), protocol)


def revoked(me: Owner, view: SessionView, protocol: Protocol = "full") -> bool:
    """A later assign (or a close) took the session from `me`."""
    return view.closed or not same(me, view.owner, protocol)


def before(me: Owner, view: SessionView) -> bool:
    """Whether a record with `view` precedes the assign of `me` (versions only rise in a log), so it
    is history to `me`'s lease: neither its input nor a revocation of it."""
    return not view.closed and (view.owner is None or view.owner.version < me.version)


def claimed_by(view: SessionView, claim: Claim) -> bool:
    """Whether the claim standing at `view` was made by this very request (`claim_id`), so asking again
    after a lost answer is answered by the claim already made."""
    me = Owner(server_id=claim.server_id, version=claim.version)
    return (not view.closed and bool(claim.claim_id) and view.claim_id == claim.claim_id
            and view.owner == me and view.claim == me and view.incarnation == claim.incarnation)


def accepts(me: Owner, release: Release, protocol: Protocol = "full") -> bool:
    """Whether an engine incarnation `me` applies a release record it reads in the log."""
    return same(me, Owner(server_id=release.server_id, version=release.version), protocol)


# ---------------------------------------------------------------- decisions


def decide_assign(view: SessionView, server_id: str, version: int, incarnation: str = "") -> Assign:
    """An assign must raise the version by exactly one; an unclaimed assignment may be superseded."""
    _open(view)
    if not server_id:
        raise BadRequest("assign needs a server_id")
    latest = view.owner.version if view.owner else 0
    if version != latest + 1:
        raise Conflict(f"assign version {version} does not follow {latest}", version=version, latest=latest)
    return Assign(server_id=server_id, version=version, incarnation=incarnation)


def decide_claim(view: SessionView, server_id: str, version: int, cursor: int,
                 protocol: Protocol = "full", incarnation: str = "", claim_id: str = "") -> Claim:
    """A claim is valid only from the latest assign's server (and version, under "full"), once, and
    only from the process the assign named, if it named one (a restarted host never inherits)."""
    _open(view)
    if cursor < 0:
        raise BadRequest(f"claim cursor {cursor} is negative", cursor=cursor)
    me = Owner(server_id=server_id, version=version)
    if view.owner is None or view.owner.server_id != server_id:
        raise Conflict(f"{server_id} is not assigned this session", server_id=server_id, version=version)
    if not same(me, view.owner, protocol):
        raise Conflict(f"claim version {version} is stale (latest {view.owner.version})",
                       server_id=server_id, version=version, latest=view.owner.version)
    if view.claim is not None:
        raise Conflict("the session is already claimed for this assignment", server_id=server_id,
                       version=version)
    if view.incarnation and view.incarnation != incarnation:
        raise Conflict(f"the assignment names incarnation {view.incarnation}, not {incarnation or '(none)'}",
                       server_id=server_id, version=version)
    return Claim(server_id=server_id, version=version, cursor=cursor, incarnation=incarnation, claim_id=claim_id)


def decide_release(view: SessionView, to: Owner | None, items: list[InputItem], input_pos: int = 0,
                   protocol: Protocol = "full") -> Release:
    """Release consecutive items, starting right after the cursor, to `to` if it is the claimed owner.

    `to` is the owner the caller means to address (from whatever view it holds); the
    check is against `view`, the log as the append will find it.
    """
    owner = current_owner(view, protocol)
    if to is None or not same(to, owner, protocol):
        raise Conflict("not the current claimed owner", to=str(to), owner=str(owner))
    if not items:
        raise BadRequest("a release needs at least one item")
    first = view.released + 1
    for offset, item in enumerate(items):
        if item.seq != first + offset:
            raise Conflict(f"item {item.seq} out of order (expected {first + offset})", seq=item.seq)
    return Release(server_id=to.server_id, version=to.version, items=items, input_pos=input_pos)


def decide_close(view: SessionView, reason: str = "") -> Close:
    _open(view)
    return Close(reason=reason)


def addressee(view: SessionView, event: Event) -> str | None:
    """The engine host whose feed must see `event` appended at `view`: a release's recipient, a claim's
    claimant, and for an assign or a close the owner it takes the session from (the new assignee on a
    first assign; None for closing a session never assigned). Hence after a claim every record up to
    and including the one that revokes it is addressed to the claimant."""
    if isinstance(event, (Release, Claim)):
        return event.server_id
    if view.owner is not None:
        return view.owner.server_id
    return event.server_id if isinstance(event, Assign) else None


# ---------------------------------------------------------------- the fold


def apply(view: SessionView, event: Event) -> SessionView:
    """The view after `event` (an event the decisions above produced for `view`)."""
    if isinstance(event, Assign):
        return SessionView(owner=Owner(server_id=event.server_id, version=event.version),
                           released=view.released, input_pos=view.input_pos, incarnation=event.incarnation)
    if isinstance(event, Claim):
        # The new owner's state reflects `cursor`: releases restart right after it.
        pos = view.input_pos if event.cursor == view.released else 0
        return SessionView(owner=view.owner, claim=Owner(server_id=event.server_id, version=event.version),
                           released=event.cursor, input_pos=pos, incarnation=event.incarnation,
                           claim_id=event.claim_id)
    if isinstance(event, Release):
        return SessionView(owner=view.owner, claim=view.claim, released=event.items[-1].seq,
                           input_pos=event.input_pos, incarnation=view.incarnation, claim_id=view.claim_id)
    return SessionView(owner=view.owner, claim=view.claim, released=view.released,
                       input_pos=view.input_pos, closed=True, incarnation=view.incarnation, claim_id=view.claim_id)


def _open(view: SessionView) -> None:
    if view.closed:
        raise Conflict("the session is closed")
