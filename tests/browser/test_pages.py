"""The session page and the fleet dashboard in a real browser, on a real stack: an avatar session is
created, spoken to and seen (canvas pixels change, latency fills); the dashboard moves it to the other host
mid-stream and the page sees the stream continue under a higher owner version; a wrong admin token is
refused; typed markup stays text; a dropped socket comes back and the stream resumes."""

from __future__ import annotations

import re

import aiohttp
import pytest
import pytest_asyncio

from tests.support.browser import session_page_in
from tests.support.web_stack import ADMIN_TOKEN

pytestmark = pytest.mark.asyncio(loop_scope="module")
XSS = '<img src=x onerror="window.__xss = 1">'
WAIT_MS = 20_000


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def session_page(stack, browser):
    ctx, page = await session_page_in(browser, stack, transport="websocket")  # test_rtc_page.py: WebRTC
    yield page
    await ctx.close()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def dashboard(stack, browser):
    ctx = await browser.new_context(viewport={"width": 1280, "height": 860})
    page = await ctx.new_page()
    await page.goto(f"{stack.origin}/dashboard")
    yield page
    await ctx.close()


async def canvas_pixels(page) -> list[int]:
    return await page.evaluate("""() => {
        const c = document.getElementById('screen');
        return Array.from(c.getContext('2d').getImageData(0, 0, c.width, c.height).data.filter((_, i) => i % 97 == 0));
    }""")


async def blocks(page) -> int:
    return await page.evaluate("window.sfPage.blocksShown")


async def test_session_page_creates_an_avatar_and_shows_it_speaking(session_page, artifacts):
    page = session_page
    await page.fill("#prompt", "a calm narrator")
    await page.click("#create-btn")
    await page.wait_for_function("() => document.getElementById('conn').textContent === 'connected'", timeout=WAIT_MS)
    await page.wait_for_function("() => window.sfPage.blocksShown >= 2", timeout=WAIT_MS)
    first = await canvas_pixels(page)
    await page.wait_for_timeout(600)
    second = await canvas_pixels(page)
    assert any(first) and first != second, "the canvas should show moving frames"
    assert await page.text_content("#frame-size") == "256×256"

    await page.fill("#say", "good morning")
    await page.press("#say", "Enter")
    await page.wait_for_function("() => document.getElementById('latency').textContent.endsWith('ms')", timeout=WAIT_MS)
    await page.wait_for_function("() => document.getElementById('rtf').textContent !== '–'", timeout=WAIT_MS)
    assert (await page.text_content("#owner")).endswith("v1 claimed")

    await page.fill("#say", XSS)
    await page.press("#say", "Enter")
    await page.wait_for_function("() => document.querySelector('#sent li span:nth-child(4)').textContent.startsWith('seq')",
                                 timeout=WAIT_MS)
    assert XSS in await page.text_content("#sent li:first-child")
    assert await page.locator("#sent img").count() == 0
    assert await page.evaluate("window.__xss") is None
    assert page.errors == []
    await page.screenshot(path=str(artifacts / "session.png"))


async def test_dashboard_refuses_a_wrong_admin_token(dashboard):
    await dashboard.fill("#token", ADMIN_TOKEN + "-not")
    await dashboard.click("#connect")
    await dashboard.wait_for_function("() => document.getElementById('conn').textContent.startsWith('refused')",
                                      timeout=WAIT_MS)
    assert await dashboard.locator("#hosts tr").count() == 0


async def test_dashboard_moves_the_session_mid_stream(stack, session_page, dashboard, artifacts):
    sid = await session_page.evaluate("window.sfPage.session.session_id")
    owner = await session_page.evaluate("window.sfPage.owner.server_id")
    other = next(h.host_id for h in stack.hosts if h.host_id != owner)
    await dashboard.fill("#token", ADMIN_TOKEN)
    await dashboard.click("#connect")
    await dashboard.wait_for_function("() => document.getElementById('conn').textContent === 'live'", timeout=WAIT_MS)
    await dashboard.wait_for_function("() => document.querySelectorAll('#hosts tr').length === 2", timeout=WAIT_MS)
    move = dashboard.locator(f"button[data-session='{sid}']")
    await move.wait_for(timeout=WAIT_MS)
    before = await blocks(session_page)
    await move.click()
    await dashboard.wait_for_function("() => document.getElementById('action').textContent.includes('committed')",
                                      timeout=WAIT_MS)
    await session_page.wait_for_function(f"() => window.sfPage.owner.server_id === '{other}' && window.sfPage.owner.version === 2 "
        "&& window.sfPage.owner.claimed", timeout=WAIT_MS)
    await session_page.wait_for_function(f"() => window.sfPage.blocksShown >= {before + 4}", timeout=WAIT_MS)
    await dashboard.wait_for_function("() => document.querySelector('#receipts tr') !== null", timeout=WAIT_MS)
    assert "bit-identical" in await dashboard.text_content("#receipts tr")
    assert "v2" in await dashboard.text_content(f"#sessions tr:has(button[data-session='{sid}'])")
    await dashboard.screenshot(path=str(artifacts / "dashboard.png"))


async def test_dashboard_drains_the_owning_host_and_the_stream_goes_on(stack, session_page, dashboard):
    """After the move: drain the session's host from the dashboard; the session leaves it (owner version
    rises, the page keeps drawing), then undrain it."""
    owner, version = await session_page.evaluate("[window.sfPage.owner.server_id, window.sfPage.owner.version]")
    drain = dashboard.locator(f"button[data-host='{owner}']")
    await drain.wait_for(timeout=WAIT_MS)
    before = await blocks(session_page)
    await drain.click()
    await dashboard.wait_for_function(f"() => document.getElementById('action').textContent.startsWith('{owner} drained')",
                                      timeout=WAIT_MS)
    await session_page.wait_for_function(f"() => window.sfPage.owner.server_id !== '{owner}' "
                                         f"&& window.sfPage.owner.version > {version} && window.sfPage.owner.claimed",
                                         timeout=WAIT_MS)
    await session_page.wait_for_function(f"() => window.sfPage.blocksShown >= {before + 3}", timeout=WAIT_MS)
    assert "moved" in await dashboard.text_content("#action")
    await dashboard.wait_for_function(f"() => document.querySelector(\"button[data-host='{owner}']\").textContent === 'Undrain'",
                                      timeout=WAIT_MS)
    await dashboard.locator(f"button[data-host='{owner}']").click()
    await dashboard.wait_for_function(f"() => document.getElementById('action').textContent.startsWith('{owner} up')",
                                      timeout=WAIT_MS)


async def test_a_dropped_socket_reconnects_and_the_stream_resumes(stack, session_page):
    reconnects, last = await session_page.evaluate("[window.sfPage.reconnects, window.sfPage.lastBlock]")
    await stack.restart_fence()
    await session_page.wait_for_function(f"() => window.sfPage.reconnects > {reconnects}", timeout=WAIT_MS)
    await session_page.wait_for_function("() => document.getElementById('conn').textContent === 'connected'",
                                         timeout=WAIT_MS)
    await session_page.wait_for_function(f"() => window.sfPage.lastBlock >= {last + 3}", timeout=WAIT_MS)
    await session_page.fill("#say", "still there?")
    await session_page.press("#say", "Enter")
    await session_page.wait_for_function("() => document.querySelector('#sent li span:nth-child(4)').textContent.startsWith('seq')", timeout=WAIT_MS)


async def test_every_service_serves_prometheus_metrics(stack):
    services = [stack.fence, stack.admission, *stack.hosts, *stack.services]
    async with aiohttp.ClientSession() as http:
        pages = []
        for svc in services:
            async with http.get(f"http://127.0.0.1:{svc.metrics_port}/metrics") as resp:
                assert resp.status == 200 and resp.content_type == "text/plain"
                pages.append(await resp.text())
    everything = "\n".join(pages)
    for name in ("sf_engine_blocks_total", "sf_engine_chunk_period_ms", "sf_fence_released_items_total",
                 "sf_fleet_host_sessions", "sf_admission_queue_length", "sf_ws_refused_total"):
        assert name in everything, name
    assert re.search(r'sf_fleet_host_sessions\{[^}]*host_id="e[01]"[^}]*state="up"', everything)
