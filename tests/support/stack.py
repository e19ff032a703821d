"""The in-process stack the stack tests share (issue 22: one builder, not one per folder): fence, placement
instances and the mover in this process on the per-test nats-server, engine hosts as their own processes
(so a test can SIGKILL, SIGSTOP or restart one). Failover, fleet, backend and WebRTC tests build on it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import msgspec
import pytest

from bench.stack import answers
from libs import bus, errors, names
from libs.contracts import Contract, Guard
from libs.fence.ownership import assign
from libs.schemas.engine import SessionInfo, SessionRef
from libs.schemas.fence import RegisterReply, RegisterRequest
from libs.schemas.placement import Placement, PlaceRequest
from services.fence.service import FenceConfig, FenceService
from services.mover.service import MoverConfig, MoverService
from services.placement.service import PlacementConfig, PlacementService
from tests.support import ownership
from tests.support.engine_hosts import EngineProcess
from tests.support.waiting import eventually

# A period far above what a block costs: admission prices a block at every stage (an avatar block: 25-90 ms
# on a quiet 2-core machine; a single-block start-up profile read 481 ms at load 20), and these tests put up
# to four sessions on the one CPU device their engine hosts share, so where a session goes must not change
# with the machine's load (issues 22, 23).
CONTRACT = Contract(session_class="C1", quality_floor=1, determinism="T1", period_ms=4000.0)


class Stack:
    def __init__(self, nc, url: str, tmp: Path) -> None:
        self.nc, self.js, self.url, self.tmp = nc, nc.jetstream(), url, tmp
        self.services: list = []
        self.engines: dict[str, EngineProcess] = {}
        self.tokens: dict[str, str] = {}

    async def start(self, placements: int = 2, **placement_cfg) -> None:
        self.fence = await self._service(FenceService(FenceConfig(nats_url=self.url, http_port=0, log_json=False)))
        self.placements = []
        for i in range(placements):
            # The fleet controller stays off unless a test turns it on: these tests place by first fit and
            # count the moves they ask for themselves. Overload relief stays off unless a test is about it:
            # on this shared machine the measured load is whatever else runs (stage timings are wall time).
            cfg = dict(nats_url=self.url, instance_id=f"placement-{i}", sweep_s=0.5, log_json=False,
                       fleet_control=False, relieve_overload=False) | placement_cfg
            self.placements.append(await self._service(PlacementService(PlacementConfig(**cfg))))
        self.mover = await self._service(MoverService(MoverConfig(nats_url=self.url, log_json=False)))

    async def _service(self, svc):
        await svc.start()
        self.services.append(svc)
        return svc

    async def engines_up(self, *host_ids: str, config: Path | None = None, answer_s: float = 180.0,
                         seen_s: float = 10.0, hostname: str = "", **env: str) -> None:
        """Start engine-host processes and wait until each answers its ping (its heartbeat is in by then) and
        every placement instance sees it. Start-up profiles each backend, so a slow one (wan_causal's decoder
        takes seconds a block on a loaded machine) needs a longer `answer_s`. `hostname`: on another machine
        (`EngineProcess`)."""
        for h in host_ids:
            self.engines[h] = EngineProcess(self.url, h, self.tmp, config, hostname=hostname, **env).start()
        for h in host_ids:
            await eventually(lambda h=h: self.answers(h), answer_s, what=f"{h} answers")
            await eventually(lambda h=h: self.placements_see(h), seen_s)

    async def placements_see(self, host_id: str) -> bool:
        return all(p.liveness.entry(host_id) is not None for p in self.placements if not p._stopping.is_set())

    async def answers(self, host_id: str) -> bool:
        return await answers(self.nc, names.engine_subject(host_id, "ping"))

    async def create(self, sid: str, guard: Guard | None = None, contract: Contract = CONTRACT,
                     backend: str = "avatar", *, seed: int = 3, prompt: str = "narrator", tier: int = 1,
                     claim_s: float = 30.0) -> Placement:
        """Register, place and assign a session as admission does; wait (up to `claim_s`) for its claim."""
        req = RegisterRequest(session_id=sid, backend=backend, seed=seed, prompt=prompt,
                              contract=msgspec.msgpack.encode(contract), tier=tier)
        self.tokens[sid] = (await bus.request(self.nc, names.FENCE_REGISTER, req, RegisterReply)).token
        placement = await bus.request(self.nc, names.PLACEMENT_PLACE, PlaceRequest(
            session_id=sid, backend=backend, contract=contract, guard=guard or Guard()), Placement)
        await assign(self.nc, sid, placement.host_id, incarnation=placement.incarnation)
        await eventually(lambda: self.claimed_by(sid, placement.host_id), claim_s)
        return placement

    async def send(self, sid: str, first: int, last: int) -> None:
        async with aiohttp.ClientSession(f"http://127.0.0.1:{self.fence.http_port}",
                                         timeout=aiohttp.ClientTimeout(total=20)) as http:
            for i in range(first, last + 1):
                async with http.post(f"/v1/sessions/{sid}/items", json={"kind": "text", "data": f"item {i}"},
                                     headers={"Authorization": f"Bearer {self.tokens[sid]}"}) as resp:
                    assert resp.status == 200, await resp.text()
                    assert (await resp.json())["seq"] == i

    async def owner(self, sid: str):
        return await ownership.owner(self.nc, sid)

    async def claimed_by(self, sid: str, host_id: str | None = None, min_version: int = 1):
        return await ownership.claimed_by(self.nc, sid, host_id, min_version)

    async def info(self, host_id: str, sid: str) -> SessionInfo | None:
        try:
            return await bus.request(self.nc, names.engine_subject(host_id, "info"), SessionRef(session_id=sid),
                                     SessionInfo, timeout_s=2.0)
        except errors.StatefleetError:
            return None

    async def consumed(self, sid: str, n: int) -> SessionInfo | None:
        """The owner's info once its state has folded in items 1..n (the runtime refuses gaps and duplicates)."""
        view = await self.owner(sid)
        if view is None:
            return None
        info = await self.info(view.owner.server_id, sid)
        return info if info is not None and info.consumed_seq == n and info.input_cursor == n else None

    async def stop(self) -> None:
        for e in self.engines.values():
            e.stop()
        for svc in reversed(self.services):
            if not svc._stopping.is_set():
                await svc.stop()


@pytest.fixture
async def stack(nats_server, nc, tmp_path):
    """The stack, not yet started: a test starts it with the settings it needs (`await stack.start(...)`)."""
    s = Stack(nc, nats_server.url, tmp_path)
    yield s
    await s.stop()


async def crash(svc) -> None:
    """A service instance dies: its tasks stop where they are and its connection drops without goodbyes."""
    svc._stopping.set()
    for task in svc._tasks:
        task.cancel()
    await asyncio.gather(*svc._tasks, return_exceptions=True)
    await svc.nc.close()
