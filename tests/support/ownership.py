"""Who owns a session, read from fence's ownership record as a test waits for a claim (issue 22: one
`claimed_by` for every folder)."""

from __future__ import annotations

from libs.fence.ownership import read_owner
from libs.schemas.fence import SessionView


async def owner(nc, sid: str) -> SessionView | None:
    """The session's ownership view once its owner has claimed it (None before, or while a claim is stale)."""
    view = (await read_owner(nc.jetstream(), sid)).view
    return view if view.claim is not None and view.claim == view.owner else None


async def claimed_by(nc, sid: str, host_id: str | None = None, min_version: int = 1) -> SessionView | None:
    """The view if the session is claimed (by `host_id`, when given) at ownership version `min_version` or
    later; None otherwise: a condition for `eventually`."""
    view = await owner(nc, sid)
    if view is None or view.owner.version < min_version:
        return None
    return view if host_id is None or view.owner.server_id == host_id else None
