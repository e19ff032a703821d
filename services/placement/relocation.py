"""One live move and its settling, for the fleet controller and the drainer alike.

The caller has reserved the session's demand on the receiver. The mover runs the move (with its
own admission); whatever it answers, or if the request fails, fence's log says where the session
is now, and that decides which reservation goes: the source's once the receiver owns the session,
otherwise the receiver's (`settle`). A drain that still has a hand-over to try keeps the
receiver's reservation for it (`landed`).
"""

from __future__ import annotations

from libs import bus, names
from libs.errors import StatefleetError
from libs.schemas.motion import MoveReceipt, MoveRequest
from services.placement.parts import Owners, Reserving

REQUEST_SLACK_S = 10.0  # past the move's own deadline, for the mover's verify and commit


class Relocation:
    def __init__(self, *, nc: bus.Client, owners: Owners, reservations: Reserving, deadline_s: float) -> None:
        self.nc, self.owners, self.reservations, self.deadline_s = nc, owners, reservations, deadline_s

    async def move(self, session_id: str, src: str, dst: str) -> str:
        """Ask the mover for a live move; what it answered ("committed: ..."), or why the request failed."""
        try:
            receipt = await bus.request(self.nc, names.MOVER_MOVE, MoveRequest(
                session_id=session_id, source=src, dest=dst, deadline_s=self.deadline_s),
                MoveReceipt, timeout_s=self.deadline_s + REQUEST_SLACK_S)
        except StatefleetError as e:
            return f"{e.code}: {e.detail}"
        return f"{receipt.outcome}: {receipt.reason}"

    async def landed(self, session_id: str, src: str, dst: str) -> bool:
        """Whether fence shows `dst` owning the session; if so the source's reservation goes."""
        if not await self.owners.owner_is(session_id, dst):
            return False
        await self.reservations.unreserve(src, [session_id])
        return True

    async def settle(self, session_id: str, src: str, dst: str) -> bool:
        """`landed`, and otherwise the receiver's reservation goes: whether the session is on `dst`."""
        if await self.landed(session_id, src, dst):
            return True
        await self.reservations.unreserve(dst, [session_id])
        return False
