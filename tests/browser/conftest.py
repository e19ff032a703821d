"""A real stack (NATS, fence, placement, mover, two engine hosts, admission with its pages) and Debian's
Chromium driven by Playwright, shared by the browser tests of one module (starting either costs seconds).

Chromium comes from the distribution (`make test` installs it when missing and it runs as root);
Playwright only drives it through `executable_path` and never downloads a browser.
"""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import socket
from pathlib import Path

import pytest
import pytest_asyncio

from libs.natsd import NatsServer
from services.admission.service import AdmissionConfig, AdmissionService
from services.engine_host.service import EngineHostConfig, EngineHostService
from services.fence.service import FenceConfig, FenceService
from services.mover.service import MoverConfig, MoverService
from services.placement.service import PlacementConfig, PlacementService
from tests.support.fence import http  # noqa: F401 (a fixture: test_ws_access takes it)

ADMIN_TOKEN = "test-admin-token-7f3c"  # a fixture's own token; `statefleet up` generates a real one
API_KEY = "test-web-tenant-key-2b1d"  # tenant "web": what a user pastes into the session page
ARTIFACTS = Path(os.environ.get("SF_TEST_ARTIFACTS", "var/test-artifacts"))


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


def chromium_path() -> str:
    path = os.environ.get("SF_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if not path:
        pytest.fail("Debian's chromium is not installed: `make test` installs it as root "
                    "(apt-get install chromium), or set SF_CHROMIUM to its path")
    return path


class Stack:
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
    s = Stack(server.url, tmp)
    try:
        await s.start()
        yield s
    finally:
        await s.stop()
        server.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def browser():
    from playwright.async_api import async_playwright

    async with async_playwright() as p:
        # WebRTC on loopback only: Chromium leaves loopback out of its candidates unless allowed, and would
        # announce its host candidates over mDNS multicast unless that is turned off.
        b = await p.chromium.launch(executable_path=chromium_path(),
                                    args=["--autoplay-policy=no-user-gesture-required", "--mute-audio",
                                          "--allow-loopback-in-peer-connection",
                                          "--disable-features=WebRtcHideLocalIpsWithMdns"])
        yield b
        await b.close()


@pytest.fixture(scope="module")
def artifacts() -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS


async def session_page_in(browser, stack: Stack, *, transport: str):
    """A new context with the session page open (the tenant's API key filled in, `transport` chosen);
    the page's uncaught errors collect in `page.errors`."""
    ctx = await browser.new_context(viewport={"width": 1180, "height": 800})
    page = await ctx.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.errors = errors
    await page.goto(f"{stack.origin}/session")
    await page.select_option("#transport", transport)
    await page.fill("#apikey", API_KEY)
    return ctx, page
