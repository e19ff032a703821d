"""The session page over WebRTC in Chromium, on loopback only: it picks WebRTC and says so, shows moving
video and plays audio from the tracks, takes input over the data channel, and keeps its one peer
connection through a live move (owner v2 shown, blocks go on, none repeated, the new blocks' frames presented
and changing); with WebRTC refused it
falls back to the sockets and says why."""

from __future__ import annotations

import dataclasses

import pytest
import pytest_asyncio

from bench import webrtc_sync
from tests.support.browser import session_page_in
from tests.support.web_stack import ADMIN_TOKEN, live_move

pytestmark = pytest.mark.asyncio(loop_scope="module")
WAIT_MS = 30_000


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def rtc_page(stack, browser):
    ctx, page = await session_page_in(browser, stack, transport="auto")
    yield page
    await ctx.close()


async def video_pixels(page) -> list[int]:
    return await page.evaluate("""() => {
        const v = document.getElementById('video');
        const c = document.createElement('canvas');
        c.width = v.videoWidth; c.height = v.videoHeight;
        const g = c.getContext('2d');
        g.drawImage(v, 0, 0);
        return Array.from(g.getImageData(0, 0, c.width, c.height).data.filter((_, i) => i % 97 == 0));
    }""")


async def audio_energy(page) -> float:
    return await page.evaluate("""async () => {
        let energy = 0;
        (await window.sfPage.rtc.pc.getStats()).forEach((s) => {
            if (s.type === 'inbound-rtp' && s.kind === 'audio') energy += s.totalAudioEnergy || 0;
        });
        return energy;
    }""")


async def test_the_page_plays_a_session_over_webrtc(rtc_page, artifacts):
    page = rtc_page
    await page.click("#create-btn")
    await page.wait_for_function("() => document.getElementById('transport-now').textContent === 'WebRTC'",
                                 timeout=WAIT_MS)
    await page.wait_for_function("() => document.getElementById('conn').textContent === 'connected'", timeout=WAIT_MS)
    await page.wait_for_function("() => window.sfPage.rtc.timing.presented >= 10 && window.sfPage.blocksShown >= 2",
                                 timeout=WAIT_MS)
    assert await page.is_hidden("#screen") and await page.is_visible("#video")
    first = await video_pixels(page)
    shown = await page.evaluate("window.sfPage.rtc.timing.presented")
    await page.wait_for_function(f"() => window.sfPage.rtc.timing.presented >= {shown + 10}", timeout=WAIT_MS)
    second = await video_pixels(page)
    assert any(first) and first != second, "the video should move"
    await page.wait_for_function("""async () => {
        let energy = 0;
        (await window.sfPage.rtc.pc.getStats()).forEach((s) => {
            if (s.type === 'inbound-rtp' && s.kind === 'audio') energy += s.totalAudioEnergy || 0; });
        return energy > 0; }""", timeout=WAIT_MS, polling=250)
    sync = await page.evaluate("(({sound, levels, frames}) => ({sound, levels, frames}))(window.sfPage.rtc.timing)")
    assert webrtc_sync.audio_offset(sync["sound"], sync["levels"]) is not None, \
        "the levels played tie the audio's RTP timestamps to the levels fence sent (A/V sync is measurable)"

    await page.fill("#say", "good morning")
    await page.press("#say", "Enter")
    await page.wait_for_function("() => document.querySelector('#sent li span:nth-child(4)').textContent.startsWith('seq')",
                                 timeout=WAIT_MS)
    await page.wait_for_function("() => document.getElementById('latency').textContent.endsWith('ms')", timeout=WAIT_MS)
    assert (await page.text_content("#owner")).endswith("v1 claimed")
    assert await page.evaluate("window.sfPage.input === null && window.sfPage.output === null"), \
        "no sockets while WebRTC carries the session"
    assert page.errors == []
    await page.screenshot(path=str(artifacts / "session-webrtc.png"))


async def test_a_live_move_keeps_the_peer_connection(stack, rtc_page):
    page = rtc_page
    sid, owner, peer = await page.evaluate(
        "[window.sfPage.session.session_id, window.sfPage.owner.server_id, window.sfPage.rtc.peerId]")
    other = next(h.host_id for h in stack.hosts if h.host_id != owner)
    before = await page.evaluate("window.sfPage.blocksShown")
    await live_move(stack, sid, other)
    await page.wait_for_function(f"() => window.sfPage.owner.server_id === '{other}' && window.sfPage.owner.version > 1 "
                                 "&& window.sfPage.owner.claimed", timeout=WAIT_MS)
    moved = await page.evaluate("window.sfPage.lastBlock")  # announced before the new owner was shown
    await page.wait_for_function(f"() => window.sfPage.blocksShown >= {before + 4}", timeout=WAIT_MS)
    # Not frozen: frames of the blocks after the move reach the screen, and what they show changes.
    await page.wait_for_function(
        f"() => Object.keys(window.sfPage.rtc.timing.shownAt).filter((b) => +b > {moved}).length >= 2", timeout=WAIT_MS)
    first = await video_pixels(page)
    shown = await page.evaluate("window.sfPage.rtc.timing.presented")
    await page.wait_for_function(f"() => window.sfPage.rtc.timing.presented >= {shown + 10}", timeout=WAIT_MS)
    assert first != await video_pixels(page), "the video after the move should move"
    state = await page.evaluate("""() => ({peer: window.sfPage.rtc.peerId, state: window.sfPage.rtc.pc.connectionState,
        transport: window.sfPage.transport, reconnects: window.sfPage.reconnects, replays: window.sfPage.replays})""")
    assert state == {"peer": peer, "state": "connected", "transport": "WebRTC", "reconnects": 0, "replays": 0}, state


async def test_the_page_falls_back_to_sockets_when_webrtc_is_refused(stack, rtc_page):
    page = rtc_page
    rtc = stack.fence.rtc
    limits = rtc.limits
    rtc.limits = dataclasses.replace(limits, max_peers=0)  # every offer refused (503), as without aiortc
    try:
        await page.click("#create-btn")
        await page.wait_for_function("() => document.getElementById('transport-now').textContent.startsWith('WebSocket (WebRTC unavailable')",
                                     timeout=WAIT_MS)
        await page.wait_for_function("() => document.getElementById('conn').textContent === 'connected'",
                                     timeout=WAIT_MS)
        await page.wait_for_function("() => window.sfPage.blocksShown >= 2", timeout=WAIT_MS)
        assert await page.is_visible("#screen") and await page.is_hidden("#video")
    finally:
        rtc.limits = limits


async def test_the_dashboard_signs_in_from_the_url_fragment_and_forgets_it(stack, browser):
    ctx = await browser.new_context()
    page = await ctx.new_page()
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url + " " + str(r.headers.get("referer"))))
    try:
        await page.goto(f"{stack.origin}/dashboard#token={ADMIN_TOKEN}")
        await page.wait_for_function("() => document.getElementById('conn').textContent === 'live'", timeout=WAIT_MS)
        assert await page.evaluate("location.href") == f"{stack.origin}/dashboard", "the fragment is gone"
        assert not [r for r in requests if ADMIN_TOKEN in r], "the token was sent in a URL or Referer"
    finally:
        await ctx.close()
