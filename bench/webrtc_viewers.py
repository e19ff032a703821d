"""What a WebRTC viewer costs fence: its process CPU with 0, 1, 2 and 4 Python (aiortc) viewers of one session.

A `statefleet up` stack (two engine hosts; fence in its own process) and one avatar session (256x256 at
25 fps, 400 ms blocks). For each viewer count the viewers connect (libs/rtc_viewer.py, video and audio),
play a few blocks, and fence's process CPU time is read over a window of the same length each time.

Keys, under `viewers.<n>`: `fence_cpu_ms_per_s` (fence's CPU per second of the window), `frames_sent` (all
viewers together: the frames of the blocks fence announced on their data channels in the window),
`frames_received` (decoded here: fewer where this process, not fence, falls behind),
`cpu_ms_per_frame_per_viewer` (fence's CPU above the no-viewer baseline over the frames sent); under `marginal`: `cpu_ms_per_s_per_added_viewer` (the slope from 1 to 4
viewers: what one more viewer of a session already watched costs). The viewers decode in this process;
only fence's CPU is counted.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from pathlib import Path

import aiohttp

from bench.common import parser, table, write
from bench.stack import UpStack
from bench.webrtc import cpu_s, create
from libs.rtc_viewer import RtcViewer

COUNTS = (0, 1, 2, 4)


async def window(stack: UpStack, created: dict, n: int, seconds: float) -> dict:
    url = created["input_url"].removesuffix("/items") + "/rtc"
    viewers = [RtcViewer(url, created["input_token"]) for _ in range(n)]
    try:
        for v in viewers:
            await v.connect()
        for v in viewers:
            await v.wait_for(lambda v=v: len(v.blocks) >= 2, timeout_s=120)
        fence = stack.pid_of("fence")
        marks = [(len(v.blocks), len(v.frames)) for v in viewers]
        cpu0, t0 = cpu_s(fence), time.monotonic()
        await asyncio.sleep(seconds)
        cpu1, t1 = cpu_s(fence), time.monotonic()
        sent = sum(b["frames"] for v, (k, _) in zip(viewers, marks, strict=True) for b in v.blocks[k:])
        got = sum(len(v.frames) - f for v, (_, f) in zip(viewers, marks, strict=True))
    finally:
        for v in viewers:
            await v.close()
    return {"fence_cpu_ms_per_s": (cpu1 - cpu0) * 1000 / (t1 - t0), "frames_sent": sent, "frames_received": got,
            "window_s": t1 - t0}


async def run(quick: bool) -> dict:
    seconds = 8.0 if quick else 20.0
    with tempfile.TemporaryDirectory(prefix="bench-webrtc-viewers-") as tmp:
        stack = UpStack(Path(tmp) / "var").start()
        try:
            await stack.ready()
            async with aiohttp.ClientSession() as http:
                created = await create(http, stack)
            per = {}
            for n in COUNTS:
                per[n] = await window(stack, created, n, seconds)
                print(f"{n} viewers: {per[n]}", flush=True)
        finally:
            stack.stop()
    base = per[0]["fence_cpu_ms_per_s"]
    for n in COUNTS[1:]:
        row = per[n]
        above_ms = (row["fence_cpu_ms_per_s"] - base) * row["window_s"]
        row["cpu_ms_per_frame_per_viewer"] = above_ms / max(1, row["frames_sent"])
    slope = (per[4]["fence_cpu_ms_per_s"] - per[1]["fence_cpu_ms_per_s"]) / 3
    return {"viewers": {str(n): r for n, r in per.items()},
            "marginal": {"cpu_ms_per_s_per_added_viewer": slope},
            "config": {"seconds_per_window": seconds, "backend": "avatar", "frames": "256x256 at 25 fps",
                       "load": os.getloadavg()}}


def main() -> None:
    args = parser("webrtc_viewers", __doc__.splitlines()[0]).parse_args()
    result = asyncio.run(run(args.quick))
    rows = [(f"viewers.{n}.{k}", r.get(k), "") for n, r in result["viewers"].items()
            for k in ("fence_cpu_ms_per_s", "frames_sent", "frames_received", "cpu_ms_per_frame_per_viewer")]
    table(rows + [("marginal.cpu_ms_per_s_per_added_viewer", result["marginal"]["cpu_ms_per_s_per_added_viewer"], "")])
    write(args.json, result)


if __name__ == "__main__":
    main()
