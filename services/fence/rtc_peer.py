"""One viewer's peer connection: the session's output as tracks, owner and block events and input
over its data channel.

The connection is fed from the bus, like the output WebSocket: `sf.output.<sid>` (whatever server
owns the session publishes there; received and decoded once for all the session's viewers here,
rtc_feed.py) and the session's log (owner changes). So a live move or a failover changes nothing
here but the blocks' origin: the same tracks go on with the next block, without renegotiation, and
blocks played already are dropped when they come again (rtc_blocks.py).

Data-channel messages from here (JSON text):
    {"hello": {"peer_id", "session_id"}}                     once it opens
    {"owner": {"server_id", "version", "claimed", "closed"}}  on open and on every change
    {"block": {"index", "owner": [server_id, version], "input_seq", "media_s", "frames", "pts",
               "step_pts", "arrived_at", "sent_at", "replays_dropped", "skipped_blocks", "cut_frames", "levels"}}
        when the block's first frame goes to the encoder; `pts` is its first frame's video timestamp
        (90 kHz, from this connection's origin), `first_pts` that of the first frame this connection sent
        (null until one was: a viewer maps RTP timestamps to these by it), `arrived_at` / `sent_at` wall-clock seconds
        (time.time()) when its first frame chunk came here and when its first frame was sent;
        `cut_frames` counts frames not played to keep latency from building up, `skipped_blocks` the blocks
        of those cut whole (rtc_media.py); `levels` [[sample, level], ...] the audio frames sent since the
        last message: first sample (16 kHz, from the same origin as `pts`) and the RFC 6464 level in their
        packets, by which a viewer maps audio RTP timestamps to media time (rtc_media.audio_level)
    {"notice": {"session_id", "kind", "reason", "at"}}       a `SessionNotice` (overload relief suspended
        the session, `overload` or `capacity_lost`, or resumed it; failover found no room: `orphaned`;
        notices.py), as the output WebSocket sends it
    {"ack": ...}                                             answers to input (rtc_input.py)
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Callable

import msgspec
import structlog
from aiortc import RTCPeerConnection, RTCSessionDescription

from libs import bus, errors, names, rtc_ice
from libs.fence.ownership import read_owner
from libs.schemas.base import decode
from libs.schemas.fence import LogRecord
from services.fence.egress import _OwnerChanges
from services.fence.ingress import Ingress
from services.fence.notices import notice_text
from services.fence.rtc_blocks import BlockMedia
from services.fence.rtc_feed import Feeds, SessionFeed
from services.fence.rtc_input import ChannelInput
from services.fence.rtc_limits import OPEN, REFUSED, RtcLimits
from services.fence.rtc_media import VIDEO_CLOCK, BlockAudioTrack, BlockVideoTrack, Playout

_log = structlog.get_logger("statefleet.fence.rtc")


class Peer:
    def __init__(self, *, nc: bus.Client, ingress: Ingress, feeds: Feeds, session_id: str, token: str, limits: RtcLimits,
                 on_closed: Callable[[Peer], None]) -> None:
        self.nc, self.ingress, self.session_id, self.token, self.limits = nc, ingress, session_id, token, limits
        self.feeds = feeds
        self.feed: SessionFeed | None = None
        self.on_closed = on_closed
        self.peer_id = uuid.uuid4().hex[:16]
        self.pc = RTCPeerConnection(rtc_ice.configuration())
        self.playout = Playout(self._block_started)
        self.channel = None
        self.input: ChannelInput | None = None
        self.owner: str | None = None  # the latest owner message, sent when the channel opens
        self._owners = _OwnerChanges(self)  # calls self.text(json) once per change
        self._subs: list = []
        self._tasks: set[asyncio.Task] = set()
        self.closed = False
        self.reason = ""

    # -------------------------------------------------------------- negotiation

    async def answer(self, offer_sdp: str) -> str:
        """Take the (checked) offer, subscribe to the session, and return the answer SDP."""
        pc = self.pc
        pc.on("datachannel", self._channel)
        pc.on("connectionstatechange", self._state)
        await pc.setRemoteDescription(RTCSessionDescription(
            sdp=rtc_ice.keep_candidates(offer_sdp, self.limits.addresses()), type="offer"))
        kinds = {t.kind for t in pc.getTransceivers()}
        pc.addTrack(BlockVideoTrack(self.playout))
        if "audio" in kinds:
            pc.addTrack(BlockAudioTrack(self.playout))
        for t in pc.getTransceivers():
            t.direction = "sendonly"
        self._subs = [await self.nc.subscribe(names.session_log_subject(self.session_id), cb=self._log),
                      await self.nc.subscribe(names.notice_subject(self.session_id), cb=self._notice)]
        self.feed = await self.feeds.join(self.session_id, self)  # subscribed (and flushed) before the answer
        await pc.setLocalDescription(await pc.createAnswer())
        self._spawn(self._deadline())
        return pc.localDescription.sdp

    async def _deadline(self) -> None:
        await asyncio.sleep(self.limits.negotiation_timeout_s)
        if self.pc.connectionState != "connected" or self.channel is None:
            REFUSED.add(1, {"reason": "deadline"})
            await self.close("negotiation deadline")

    async def _state(self) -> None:
        state = self.pc.connectionState
        if state == "connected":
            with contextlib.suppress(errors.StatefleetError):  # no log tail yet: the first record tells
                self._owners.seen((await read_owner(self.ingress.sessions.js, self.session_id)).view)
        elif state in ("failed", "closed"):
            if state == "failed":  # ICE consent lost: the viewer went away or stopped answering
                REFUSED.add(1, {"reason": "consent"})
            await self.close(f"connection {state}")

    def _channel(self, channel) -> None:
        if self.channel is not None:  # one channel per connection: a second is not ours to serve
            channel.close()
            return
        self.channel = channel
        self.input = ChannelInput(self.ingress, self.session_id, self.token, self.text)
        channel.on("message", self.input.message)

        def opened() -> None:
            self.text(msgspec.json.encode({"hello": {"peer_id": self.peer_id, "session_id": self.session_id}}))
            if self.owner is not None:
                self.text(self.owner)
        if channel.readyState == "open":
            opened()
        else:
            channel.on("open", opened)

    # -------------------------------------------------------------- media and events

    async def _log(self, msg) -> None:
        with contextlib.suppress(errors.SchemaError):
            self._owners.seen(decode(msg.data, LogRecord).view)

    async def _notice(self, msg) -> None:
        if (text := notice_text(msg.data)) is not None:
            self.text(text)

    def media(self, media: BlockMedia) -> None:
        # Played from the first block after the data channel opened: every frame sent has its block's
        # message before it (a viewer can map each frame to its block), and a viewer still connecting
        # gets no backlog.
        if not self.closed and self.channel is not None and self.channel.readyState == "open":
            self.playout.place(media)

    def _block_started(self, media: BlockMedia, pts: int) -> None:
        assert media.frames is not None  # playout starts blocks from their frames
        n = media.frames.shape[0]
        owner = self._owners.last
        self.text(msgspec.json.encode({"block": {
            "index": media.block, "owner": [owner[0], owner[1]] if owner else None, "input_seq": media.input_seq,
            "media_s": media.media_s, "frames": n, "pts": pts, "first_pts": self.playout.first_pts,
            "step_pts": round(media.media_s / n * VIDEO_CLOCK) if n and media.media_s > 0 else 0,
            "arrived_at": media.arrived_at, "sent_at": time.time(),
            "replays_dropped": self.feed.blocks.replays_dropped if self.feed else 0,
            "skipped_blocks": self.playout.skipped_blocks, "cut_frames": self.playout.cut_frames,
            "levels": list(self.playout.levels)}}))
        self.playout.levels.clear()

    def text(self, data: str | bytes) -> None:
        """Send one message on the data channel (owner messages wait for it to open); a viewer whose
        channel holds more than max_buffered_bytes unread is dropped, not waited for."""
        data = data.decode() if isinstance(data, bytes) else data
        if data.startswith('{"owner"'):
            self.owner = data
        channel = self.channel
        if channel is None or channel.readyState != "open" or self.closed:
            return
        if channel.bufferedAmount > self.limits.max_buffered_bytes:
            REFUSED.add(1, {"reason": "slow_reader"})
            self._spawn(self.close("viewer stopped reading"))
            return
        channel.send(data)

    # -------------------------------------------------------------- ending

    def _spawn(self, coro) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self, reason: str) -> None:
        if self.closed:
            return
        self.closed, self.reason = True, reason
        OPEN.add(-1)
        self.on_closed(self)
        _log.info("rtc_peer_closed", session_id=self.session_id, peer_id=self.peer_id, reason=reason)
        self.playout.close()
        await self.feeds.leave(self.session_id, self)
        for sub in self._subs:
            await bus.quietly(sub.unsubscribe())
        if self.input is not None:
            await self.input.close()
        await self.pc.close()
        current = asyncio.current_task()
        for task in list(self._tasks):
            if task is not current:
                task.cancel()
