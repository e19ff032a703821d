"""Debian's Chromium driven by Playwright, one per test module, and the session page opened in it (issue 22: shared
from here, not from tests/browser/conftest.py).

Chromium comes from the distribution (`make test` installs it when missing and it runs as root);
Playwright only drives it through `executable_path` and never downloads a browser.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import pytest_asyncio

from tests.support.web_stack import API_KEY, WebStack

ARTIFACTS = Path(os.environ.get("SF_TEST_ARTIFACTS", "var/test-artifacts"))


def chromium_path() -> str:
    path = os.environ.get("SF_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if not path:
        pytest.fail("Debian's chromium is not installed: `make test` installs it as root "
                    "(apt-get install chromium), or set SF_CHROMIUM to its path")
    return path


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


async def session_page_in(browser, stack: WebStack, *, transport: str):
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
