"""The engine hosts' verbs the fleet controller calls: `status`, `suspend`, `resume` (`sf.engine.<host>.*`)."""

from __future__ import annotations

import asyncio

from libs import bus, names
from libs.errors import StatefleetError
from libs.schemas.engine import HostStatus, SessionInfo, SessionRef, StatusRequest

STATUS_TIMEOUT_S = 2.0


class EngineVerbs:
    def __init__(self, *, nc: bus.Client) -> None:
        self.nc = nc

    async def statuses(self, host_ids: list[str]) -> dict[str, list[SessionInfo]]:
        """Each host's sessions; a host that does not answer is left out."""
        async def one(h: str) -> tuple[str, list[SessionInfo] | None]:
            try:
                st = await bus.request(self.nc, names.engine_subject(h, "status"), StatusRequest(), HostStatus,
                                       timeout_s=STATUS_TIMEOUT_S)
                return h, st.sessions
            except StatefleetError:
                return h, None

        got = await asyncio.gather(*(one(h) for h in host_ids))
        return {h: infos for h, infos in got if infos is not None}

    async def suspend(self, host_id: str, session_id: str, hold_share: bool = False) -> None:
        await bus.request(self.nc, names.engine_subject(host_id, "suspend"),
                          SessionRef(session_id=session_id, hold_share=hold_share), SessionInfo)

    async def resume(self, host_id: str, session_id: str) -> None:
        await bus.request(self.nc, names.engine_subject(host_id, "resume"), SessionRef(session_id=session_id),
                          SessionInfo)
