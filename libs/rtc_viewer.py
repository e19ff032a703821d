"""A WebRTC viewer of one session in Python (aiortc): what the session page does, for tests, benchmarks
and server-side clients that want the media as a call delivers it.

    viewer = RtcViewer(rtc_url, token)          # rtc_url: http://<fence>/v1/sessions/<sid>/rtc
    await viewer.connect()
    ... viewer.frames (received video frames), viewer.blocks (block messages), viewer.owners ...
    ack = await viewer.send({"kind": "text", "data": "hello", "id": "..."})
    await viewer.close()

Only host candidates on `addresses` are offered (loopback unless told otherwise), and no STUN server.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import msgspec
import numpy as np
from aiortc import RTCDataChannel, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from libs import rtc_ice
from libs.tasks import STOP_TIMEOUT_S, cancel_and_wait


@dataclass(slots=True)
class Received:
    at: float  # time.time() it came out of the decoder
    pts: int  # RTP timestamp (random origin: compare differences)
    mean: float  # mean pixel value (video) or RMS (audio): enough to see motion and sound


@dataclass
class RtcViewer:
    url: str
    token: str
    addresses: tuple[str, ...] = rtc_ice.LOOPBACK
    audio: bool = True
    frames: list[Received] = field(default_factory=list)
    sound: list[Received] = field(default_factory=list)
    blocks: list[dict[str, Any]] = field(default_factory=list)
    owners: list[dict[str, Any]] = field(default_factory=list)
    hello: dict[str, Any] | None = None
    peer_id: str = ""

    def __post_init__(self) -> None:
        self.pc: RTCPeerConnection | None = None
        self.channel: RTCDataChannel | None = None
        self.opened = asyncio.Event()
        self.changed = asyncio.Event()
        self._acks: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._tasks: list[asyncio.Task[None]] = []

    async def connect(self, *, timeout_s: float = 30.0) -> None:
        rtc_ice.offer_only(self.addresses)
        self.pc = pc = RTCPeerConnection(rtc_ice.configuration())
        pc.addTransceiver("video", direction="recvonly")
        if self.audio:
            pc.addTransceiver("audio", direction="recvonly")
        self.channel = channel = pc.createDataChannel("sf")
        channel.on("open", self.opened.set)
        channel.on("message", self._message)
        pc.on("track", self._track)
        try:
            await pc.setLocalDescription(await pc.createOffer())
            status, answer = await offer(self.url, self.token, pc.localDescription.sdp)
            if status != 200:
                raise ConnectionError(f"offer refused: {status} {answer}")
            self.peer_id = answer["peer_id"]
            await pc.setRemoteDescription(RTCSessionDescription(
                sdp=rtc_ice.keep_candidates(answer["sdp"], self.addresses), type="answer"))
            await asyncio.wait_for(self.opened.wait(), timeout_s)
        except BaseException:
            await pc.close()
            raise

    async def send(self, item: dict[str, Any], *, timeout_s: float = 30.0) -> dict[str, Any]:
        """Send one input item; its answer (answers come in order)."""
        assert self.channel is not None, "connect first"
        self.channel.send(msgspec.json.encode(item).decode())
        return await asyncio.wait_for(self._acks.get(), timeout_s)

    async def wait_for(self, predicate: Callable[[], bool], *, timeout_s: float = 60.0) -> None:
        async def poll() -> None:
            while not predicate():
                self.changed.clear()
                await self.changed.wait()
        await asyncio.wait_for(poll(), timeout_s)

    async def close(self) -> None:
        await cancel_and_wait(self._tasks, timeout_s=STOP_TIMEOUT_S)
        if self.pc is not None:
            await self.pc.close()

    def _message(self, data: str | bytes) -> None:
        msg: dict[str, Any] = msgspec.json.decode(data)
        if "block" in msg:
            self.blocks.append(msg["block"] | {"received_at": time.time()})
        elif "owner" in msg:
            self.owners.append(msg["owner"])
        elif "ack" in msg:
            self._acks.put_nowait(msg["ack"])
        elif "hello" in msg:
            self.hello = msg["hello"]
        self.changed.set()

    def _track(self, track: MediaStreamTrack) -> None:
        self._tasks.append(asyncio.create_task(self._read(track)))

    async def _read(self, track: MediaStreamTrack) -> None:
        into = self.frames if track.kind == "video" else self.sound
        with contextlib.suppress(MediaStreamError):
            while True:
                frame = await track.recv()
                values = frame.to_ndarray()  # type: ignore[union-attr]  # a track yields frames, never packets
                level = float(values.mean()) if track.kind == "video" else \
                    float(np.sqrt(np.mean(values.astype(np.float64) ** 2)))
                into.append(Received(time.time(), int(frame.pts or 0), level))
                self.changed.set()


async def offer(url: str, token: str, sdp: str | bytes, *, content: bytes | None = None) -> tuple[int, dict[str, Any]]:
    """POST an offer (or, with `content`, any body); the status and the JSON answer or problem."""
    body = content if content is not None else msgspec.json.encode({"type": "offer", "sdp": sdp})
    async with aiohttp.ClientSession() as http, http.post(
            url, data=body, headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"}) as r:
        return r.status, await r.json(content_type=None)
