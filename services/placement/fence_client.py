"""What placement asks fence: a session's owner as the log shows it, its contract and backend, assigns,
and orphan marks on the `sf_sessions` hint (fence writes it).

Fence's log is the truth placement decides on (the `sf_sessions` mirror only says which sessions to
read); an assign is fence's compare-and-set on the version the caller saw. A session's contract
and backend never change, so they are asked once and kept.
"""

from __future__ import annotations

from collections.abc import Mapping

from libs import bus, names
from libs.contracts import Contract
from libs.errors import StatefleetError
from libs.fence.block_journal import recorded_threads
from libs.fence.ownership import assign, read_owner
from libs.schemas.base import decode
from libs.schemas.common import ShedKind
from libs.schemas.fence import MarkReply, MarkRequest, MetaRequest, SessionMeta, SessionView


class FenceClient:
    def __init__(self, *, nc: bus.Client, js: bus.JetStream) -> None:
        self.nc, self.js = nc, js
        self._specs: dict[str, tuple[Contract, str]] = {}  # session → (contract, backend): never changes

    async def view(self, session_id: str) -> SessionView:
        """The log's latest view of the session (a hint: the next compare-and-set decides)."""
        return (await read_owner(self.js, session_id)).view

    async def owner_is(self, session_id: str, host_id: str) -> bool:
        owner = (await self.view(session_id)).owner
        return owner is not None and owner.server_id == host_id

    async def assign(self, session_id: str, host_id: str, *, expect_version: int, incarnation: str) -> None:
        """Fence assigns `host_id` at the next version; `Conflict` if the session moved on from `expect_version`."""
        await assign(self.nc, session_id, host_id, expect_version=expect_version, incarnation=incarnation)

    async def mark(self, session_id: str, version: int, orphaned: str = "", *, shed: str = "", shed_kind: ShedKind = "",
                   resumed: bool = False) -> None:
        """Ask fence (the `sf_sessions` hint's one writer) to mark the session at owner version `version`:
        orphaned, saying why no host takes it, or suspended, saying why it was shed from its device (its
        `shed_kind`: overload | capacity_lost); neither clears the mark (the summary says what the log says),
        `resumed` does: a shed session is back on a device. Fence tells the client of a shed or a resume."""
        await bus.request(self.nc, names.FENCE_MARK, MarkRequest(
            session_id=session_id, version=version, orphaned=orphaned, shed=shed,
            shed_kind=shed_kind, resumed=resumed), MarkReply)

    def remember(self, session_id: str, contract: Contract, backend: str) -> None:
        self._specs[session_id] = (contract, backend)

    async def threads(self, session_id: str) -> int:
        """The torch threads the session's blocks run at, as its block journal records them (0: none
        recorded, or the journal unreadable now: placement then prefers no host for it)."""
        try:
            return await recorded_threads(self.js, session_id)
        except StatefleetError:
            return 0

    def known(self) -> Mapping[str, tuple[Contract, str]]:
        """Every session's (contract, backend) asked or told so far, without asking fence."""
        return self._specs

    async def spec(self, session_id: str) -> tuple[Contract, str]:
        """The session's contract and backend, from fence's meta the first time."""
        if session_id not in self._specs:
            meta = await bus.request(self.nc, names.FENCE_META, MetaRequest(session_id=session_id), SessionMeta)
            # decoded like every message, so a malformed contract is a `SchemaError`, not a bare DecodeError
            self._specs[session_id] = (decode(meta.contract, Contract), meta.backend)
        return self._specs[session_id]
