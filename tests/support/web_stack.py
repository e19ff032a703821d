"""The whole stack in this process (NATS, fence, placement, mover, two engine hosts, admission with its pages),
one per test module (starting it costs seconds), for the browser and WebRTC tests; and sessions created
and moved through admission's API as the page does (issue 22: shared from here, not from a folder's
conftest.py). Loopback only: fence offers 127.0.0.1 alone, and the Python viewer likewise."""

from __future__ import annotations

import asyncio
import random
import socket
from pathlib import Path

import aiohttp
import pytest_asyncio

from libs.natsd import NatsServer
from services.admission.service import AdmissionConfig, AdmissionService
from services.engine_host.service import EngineHostConfig, EngineHostService
from services.fence.service import FenceConfig, FenceService
from services.mover.service import MoverConfig, MoverService
from services.placement.service import PlacementConfig, PlacementService
from tests.support.waiting import eventually

ADMIN_TOKEN = "test-admin-token-7f3c"  # a fixture's own token; `statefleet up` generates a real one
API_KEY = "test-web-tenant-key-2b1d"  # tenant "web": what a user pastes into the session page


def unclaimable_port() -> int:
    """A free port below Linux's ephemeral range (32768+), so no socket the stack opens on port 0 can
    take it between choosing it here and the service binding it (the two HTTP ports must be known to
    each other before either service starts: fence allows admission's origin, admission names fence)."""
    for _ in range(100):
        port = random.randint(20000, 32000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port below the ephemeral range")


class WebStack:
    def __init__(self, nats_url: str, tmp: Path) -> None:
        self.nats_url, self.tmp = nats_url, tmp
        self.admission_port, self.fence_port = unclaimable_port(), unclaimable_port()
        self.origin = f"http://127.0.0.1:{self.admission_port}"
        self.quiet = dict(nats_url=nats_url, log_json=False, heartbeat_s=0.5, metrics_port=0)
        self.services: list = []

    async def start(self) -> None:
        self.fence = await self.start_fence()
        for svc in (PlacementService(PlacementConfig(**self.quiet)), MoverService(MoverConfig(**self.quiet))):
            await svc.start()
            self.services.append(svc)
        self.hosts = [EngineHostService(EngineHostConfig(**self.quiet, host_id=h, profile_blocks=1,
                                                         checkpoint_dir=str(self.tmp / "ckpt"), torch_threads=1))
                      for h in ("e0", "e1")]
        for h in self.hosts:
            await h.start()
        self.admission = AdmissionService(AdmissionConfig(
            **self.quiet, http_port=self.admission_port, admin_token=ADMIN_TOKEN, api_keys={"web": API_KEY},
            ingress_url=f"http://127.0.0.1:{self.fence_port}"))
        await self.admission.start()
        for _ in range(200):  # admission sees both engine hosts' heartbeats
            if len(self.admission._live()) == 2:
                break
            await asyncio.sleep(0.05)

    async def start_fence(self) -> FenceService:
        fence = FenceService(FenceConfig(**self.quiet, http_port=self.fence_port, allowed_origins=self.origin))
        await fence.start()
        return fence

    async def restart_fence(self) -> None:
        """Drop every session socket for real: the ingress goes away and comes back on the same port."""
        await self.fence.stop()
        self.fence = await self.start_fence()

    async def stop(self) -> None:
        for svc in [self.admission, *self.hosts, *reversed(self.services), self.fence]:
            await svc.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("browser-stack")
    server = NatsServer(store_dir=tmp / "nats").start()
    s = WebStack(server.url, tmp)
    try:
        await s.start()
        yield s
    finally:
        await s.stop()
        server.stop()


async def create_session(s: WebStack, backend: str = "avatar", **contract) -> dict:
    """A session as the page creates it; the reply carries its input token and URLs. Created once admission
    hears both engine hosts (on a loaded machine a heartbeat can be late, and a host not heard is not offered)."""
    await eventually(lambda: len(s.admission._live()) == 2, timeout_s=60, what="admission hears both hosts")
    period = {"avatar": 400, "world": 1000 / 15}[backend]
    body = {"backend": backend, "seed": 3, "prompt": "a calm narrator",
            "contract": {"session_class": "C1", "quality_floor": 1, "determinism": "T1", "period_ms": period,
                         **contract}}
    async with aiohttp.ClientSession() as http, http.post(
            f"{s.origin}/v1/sessions", json=body, headers={"Authorization": f"Bearer {API_KEY}"}) as r:
        reply = await r.json()
        assert r.status in (201, 202), reply  # placed, or queued until a host has room: it plays once placed
    return reply


@pytest_asyncio.fixture(loop_scope="module")
async def sessions(stack):
    """`await sessions()`: a session created as the page does, deleted after the test (the module's two engine
    hosts, on a loaded machine, have room for a few at a time)."""
    made: list[dict] = []

    async def create(**contract) -> dict:
        made.append(await create_session(stack, **contract))
        return made[-1]
    yield create
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {API_KEY}"}) as http:
        for created in made:
            async with http.delete(f"{stack.origin}/v1/sessions/{created['session_id']}") as r:
                assert r.status < 500, await r.text()


async def live_move(s: WebStack, session_id: str, to: str, attempts: int = 3) -> dict:
    """A committed live move of the session to host `to` (admin API). On a loaded machine the mover may roll a
    move back (a step past its deadline): that changes nothing, so it is tried again, up to `attempts` times."""
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as http:
        for _ in range(attempts):
            async with http.post(f"{s.origin}/v1/admin/sessions/{session_id}/move", json={"to": to}) as r:
                receipt = await r.json()
                assert r.status == 200, receipt
            if receipt["outcome"] != "rolled_back":
                break
    assert receipt["outcome"] == "committed", receipt
    return receipt


def rtc_url(created: dict) -> str:
    return created["input_url"].removesuffix("/items") + "/rtc"
