"""The session page's two media paths, WebRTC and the output WebSocket, on the same sessions in one run.

A `statefleet up` stack (two engine hosts; fence in its own process) and Debian's Chromium driven by
Playwright, loopback only. Each round creates one avatar session and views it through the real session
page over one path, then the other (the order alternates between rounds), for the same time each.

Per path (keys under `webrtc` and `websocket`, medians over rounds of each round's figure):
- glass_to_glass_ms_p50/p95: a block's first chunk on the bus (this process subscribes to
  `sf.output.<sid>`: the moment the engine published it, to within a loopback delivery) to its first
  frame presented in the page (WebRTC: requestVideoFrameCallback's presentationTime, mapped to the block
  by the data channel's timestamps; WebSocket: the canvas draw). Same machine, one clock.
- frame_interval_jitter_ms_p95: |presentation interval - media interval| of consecutive frames.
- av_skew_ms_p95: WebRTC: |when a moment of the media was heard - when it was seen| for each audio packet
  played, the audio's RTP timestamps tied to media time by the levels fence sent (bench/webrtc_sync.py);
  `av_skew_ms_p50_signed` its median with sign (positive: sound after picture), and, for comparison,
  `av_skew_estimated_ms_p95` the |audio - video| estimatedPlayoutTimestamp of the inbound streams (getStats,
  sampled every 250 ms: the browser's own view, on the sender's clock of sending). WebSocket: |audio start -
  first frame| as the page schedules each block.
- bytes_per_s: bytes the viewer received per second (WebRTC: transport bytesReceived; WebSocket: the
  output socket's messages).
- cpu_ms_per_frame: fence's process CPU time over the window / frames presented.

Targets (issue 27): WebRTC glass-to-glass p95 <= the WebSocket path's and <= one block period + 60 ms;
jitter p95 <= 10 ms; bytes/s <= 0.2x the WebSocket path's at equal resolution and frame rate.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

import aiohttp

from bench import webrtc_floor, webrtc_sync
from bench.common import parser, percentile, table, write
from bench.stack import UpStack
from libs import bus, names
from libs.schemas.base import decode
from libs.schemas.engine import OutputChunk

PERIOD_MS = 400.0  # the avatar's block: 10 frames at 25 fps
KEYS = ("glass_to_glass_ms_p50", "glass_to_glass_ms_p95", "frame_interval_jitter_ms_p95", "av_skew_ms_p95",
        "bytes_per_s", "cpu_ms_per_frame")
SYNC = ("av_skew_ms_p50_signed", "av_skew_estimated_ms_p95")
STAGES = ("stage_bus_to_fence_ms_p50", "stage_fence_playout_ms_p50", "stage_encoder_to_presented_ms_p50",
          "jitter_buffer_video_ms", "jitter_buffer_audio_ms")
SAMPLE_JS = """async () => {
    const p = window.sfPage, out = {wsBytes: p.wsBytes, audio: null, video: null, rtcBytes: 0};
    if (!p.rtc) return out;
    out.buffer = {};
    (await p.rtc.pc.getStats()).forEach((s) => {
        if (s.type === 'transport') out.rtcBytes += s.bytesReceived || 0;
        if (s.type === 'inbound-rtp' && s.estimatedPlayoutTimestamp) out[s.kind] = s.estimatedPlayoutTimestamp;
        if (s.type === 'inbound-rtp') out.buffer[s.kind] = [s.jitterBufferDelay || 0, s.jitterBufferEmittedCount || 0];
    });
    return out;
}"""
TIMING_JS = """() => {
    const p = window.sfPage, t = p.rtc ? p.rtc.timing : p.timing;
    return {shownAt: t.shownAt, frames: t.frames, skews: p.timing.skews, transport: p.transport,
            unmatched: p.rtc ? p.rtc.timing.unmatched : 0, stamps: p.rtc ? p.rtc.timing.stamps : {},
            sound: p.rtc ? p.rtc.timing.sound : [], levels: p.rtc ? p.rtc.timing.levels : []};
}"""


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def view(browser, stack: UpStack, created: dict, transport: str, seconds: float,
               published: dict[int, float]) -> dict:
    """View the session for `seconds` through the page over `transport`; that window's figures."""
    ctx = await browser.new_context()
    page = await ctx.new_page()
    try:
        await page.goto(f"{stack.admission_url}/session")
        await page.select_option("#transport", transport)
        await page.evaluate("(c) => { startAudio(); open(c); }", created)  # the page's own, as Create does
        want = "WebRTC" if transport == "auto" else "WebSocket"
        await page.wait_for_function(f"() => window.sfPage.transport === '{want}' && window.sfPage.blocksShown >= 3",
                                     timeout=60_000)
        fence = stack.pid_of("fence")
        first, cpu0, t0 = await page.evaluate(SAMPLE_JS), cpu_s(fence), time.monotonic()
        skews = []
        while time.monotonic() - t0 < seconds:
            await asyncio.sleep(0.25)
            s = await page.evaluate(SAMPLE_JS)
            if s["audio"] and s["video"]:
                skews.append(abs(s["audio"] - s["video"]))
        last, cpu1, t1 = await page.evaluate(SAMPLE_JS), cpu_s(fence), time.monotonic()
        timing = await page.evaluate(TIMING_JS)
    finally:
        await ctx.close()
    wall0 = time.time() * 1000 - (time.monotonic() - t0) * 1000  # the window's start on the wall clock
    frames = [f for f in timing["frames"] if f[0] >= wall0]
    g2g = [at - published[int(b)] for b, at in timing["shownAt"].items()
           if int(b) in published and at >= wall0]
    jitter = [abs((b[0] - a[0]) - (b[1] - a[1])) for a, b in zip(frames, frames[1:], strict=False)]
    estimated = skews
    signed = webrtc_sync.skews(timing["sound"], timing["levels"], timing["frames"], wall0)
    skews = [abs(s) for s in (signed if transport == "auto" else timing["skews"])]
    key = "rtcBytes" if transport == "auto" else "wsBytes"
    stages = breakdown(timing["stamps"], timing["shownAt"], published, wall0, first.get("buffer"), last.get("buffer"))
    return {"glass_to_glass_ms_p50": percentile(g2g, 50), "glass_to_glass_ms_p95": percentile(g2g, 95),
            "frame_interval_jitter_ms_p95": percentile(jitter, 95),
            "av_skew_ms_p95": percentile(skews, 95) if skews else None,
            "av_skew_ms_p50_signed": percentile(signed, 50) if signed else None,
            "av_skew_estimated_ms_p95": percentile(estimated, 95) if estimated else None,
            "bytes_per_s": (last[key] - first[key]) / (t1 - t0),
            "cpu_ms_per_frame": (cpu1 - cpu0) * 1000 / max(1, len(frames)),
            "blocks": len(g2g), "frames": len(frames), "unmatched_frames": timing["unmatched"], **stages}


def breakdown(stamps: dict, shown: dict, published: dict[int, float], wall0: float, buf0, buf1) -> dict:
    """Where a WebRTC block's glass-to-glass time goes (medians, ms): bus to fence (its first frame chunk there),
    fence's playout (to its first frame handed to the encoder), encoder to presented; and each inbound
    stream's mean jitter-buffer delay over the window (Chromium's getStats)."""
    rows = [(published[int(b)], s[0], s[1], shown[b]) for b, s in stamps.items()
            if b in shown and int(b) in published and shown[b] >= wall0 and s[0] > 0]
    if not rows:
        return {}
    out = {"stage_bus_to_fence_ms_p50": statistics.median(r[1] - r[0] for r in rows),
           "stage_fence_playout_ms_p50": statistics.median(r[2] - r[1] for r in rows),
           "stage_encoder_to_presented_ms_p50": statistics.median(r[3] - r[2] for r in rows)}
    for kind in ("video", "audio"):
        if buf0 and buf1 and kind in buf0 and kind in buf1 and buf1[kind][1] > buf0[kind][1]:
            out[f"jitter_buffer_{kind}_ms"] = (buf1[kind][0] - buf0[kind][0]) * 1000 / (buf1[kind][1] - buf0[kind][1])
    return out


async def run(quick: bool) -> dict:
    from playwright.async_api import Error as PlaywrightError
    from playwright.async_api import async_playwright

    from tests.support.browser import chromium_path

    rounds, seconds = (2, 8.0) if quick else (5, 20.0)
    with tempfile.TemporaryDirectory(prefix="bench-webrtc-") as tmp:
        stack = UpStack(Path(tmp) / "var").start()
        try:
            await stack.ready()
            nc = await bus.connect(stack.cli_url(), name="bench-webrtc")
            async with async_playwright() as p, aiohttp.ClientSession() as http:
                browser = await p.chromium.launch(executable_path=chromium_path(), args=[
                    "--autoplay-policy=no-user-gesture-required", "--mute-audio",
                    "--allow-loopback-in-peer-connection", "--disable-features=WebRtcHideLocalIpsWithMdns"])
                per: dict[str, list[dict]] = {"webrtc": [], "websocket": []}
                floor: dict[str, list[dict]] = {"chromium": [], "aiortc": []}
                for r in range(rounds):
                    created = await create(http, stack)
                    published: dict[int, float] = {}

                    async def on_chunk(msg, published=published) -> None:
                        chunk = decode(msg.data, OutputChunk)
                        published.setdefault(chunk.block, time.time() * 1000)
                    sub = await nc.subscribe(names.output_subject(created["session_id"]), cb=on_chunk)
                    order = ("auto", "websocket") if r % 2 == 0 else ("websocket", "auto")
                    for transport in order:
                        try:
                            figures = await view(browser, stack, created, transport, seconds, published)
                        except PlaywrightError as e:  # a view that never got going: said, not averaged in
                            figures = {"failed": str(e).splitlines()[0]}
                        per["webrtc" if transport == "auto" else "websocket"].append(figures)
                        print(f"round {r} {transport}: {figures}", flush=True)
                    await sub.unsubscribe()
                    floor["chromium"].append(await webrtc_floor.chromium(browser, seconds))
                    floor["aiortc"].append(await webrtc_floor.aiortc_pair(seconds))
                    print(f"round {r} floor: {floor['chromium'][-1]} {floor['aiortc'][-1]}", flush=True)
                await browser.close()
            await nc.close()
        finally:
            stack.stop()
    result = {path: summary(rows) for path, rows in per.items()}
    result["floor"] = {receiver: summary(rows) for receiver, rows in floor.items()}
    rtc, ws = result["webrtc"], result["websocket"]
    result["ratios"] = {"bytes_per_s_webrtc_over_websocket": rtc["bytes_per_s"] / ws["bytes_per_s"],
                        "glass_to_glass_p95_webrtc_over_websocket":
                            rtc["glass_to_glass_ms_p95"] / ws["glass_to_glass_ms_p95"]}
    result["targets"] = {
        "glass_to_glass_p95_le_websocket": rtc["glass_to_glass_ms_p95"] <= ws["glass_to_glass_ms_p95"],
        "glass_to_glass_p95_le_period_plus_60ms": rtc["glass_to_glass_ms_p95"] <= PERIOD_MS + 60,
        "jitter_p95_le_10ms": rtc["frame_interval_jitter_ms_p95"] <= 10,
        "bytes_le_0.2x_websocket": result["ratios"]["bytes_per_s_webrtc_over_websocket"] <= 0.2}
    result["config"] = {"rounds": rounds, "seconds_per_view": seconds, "backend": "avatar", "period_ms": PERIOD_MS,
                        "frames": "256x256 at 25 fps", "load": os.getloadavg()}
    return result


def summary(rows: list[dict]) -> dict:
    out = {}
    for k in (*KEYS, *SYNC, *STAGES, "blocks", "frames", "unmatched_frames"):
        values = [r[k] for r in rows if r.get(k) is not None and r[k] == r[k]]
        if values or k in KEYS:
            out[k] = statistics.median(values) if values else None
    out["rounds"] = rows
    out["failed_views"] = sum("failed" in r for r in rows)
    return out


async def create(http: aiohttp.ClientSession, stack: UpStack) -> dict:
    body = {"backend": "avatar", "seed": 1, "prompt": "a calm narrator",
            "contract": {"session_class": "C1", "quality_floor": 1, "determinism": "T1", "period_ms": PERIOD_MS}}
    async with http.post(f"{stack.admission_url}/v1/sessions", json=body, headers=stack.admin_headers()) as r:
        reply = await r.json()
        if r.status not in (200, 201):
            raise RuntimeError(f"create failed: {r.status} {reply}")
    return reply


def main() -> None:
    args = parser("webrtc", __doc__.splitlines()[0]).parse_args()
    result = asyncio.run(run(args.quick))
    rows = [(f"{path}.{k}", result[path][k], "") for path in ("webrtc", "websocket") for k in KEYS]
    rows += [(f"webrtc.{k}", result["webrtc"].get(k), "") for k in (*SYNC, *STAGES)]
    rows += [(f"floor.{r}.{k}", result["floor"][r].get(k), "") for r in ("chromium", "aiortc") for k in KEYS[:4]]
    table(rows + [(f"target {k}", str(v), "") for k, v in result["targets"].items()])
    write(args.json, result)


if __name__ == "__main__":
    main()
