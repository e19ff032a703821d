"""One session's output for all of its WebRTC viewers on this fence instance, received and decoded once.

Each viewer (rtc_peer.Peer) encodes its own VP8 and Opus (its own rate control, key frames and
timeline), but what comes before the encoders is the same for every viewer of a session: the output
chunks from `sf.output.<sid>`, the blocks put back together and each frame's PNG decoded and converted
to the encoder's pixel format (rtc_blocks.py). A feed does that once, subscribed while the session has
a viewer here, and hands every block to each viewer as it completes; a viewer joining a running feed
plays from the next block on. The blocks are arrays no viewer writes, so they are shared, not copied.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from libs import bus, errors, names
from libs.schemas.base import decode
from libs.schemas.engine import OutputChunk
from services.fence.rtc_blocks import BlockAssembler, BlockMedia


class Viewer(Protocol):
    def media(self, media: BlockMedia) -> None: ...


class SessionFeed:
    def __init__(self, nc: bus.Client, session_id: str) -> None:
        self.nc, self.session_id = nc, session_id
        self.viewers: list[Viewer] = []
        self.blocks = BlockAssembler(self._media)
        self._sub: bus.Subscription | None = None

    async def start(self) -> None:
        self._sub = await self.nc.subscribe(names.output_subject(self.session_id), cb=self._chunk)
        await self.nc.flush()

    async def stop(self) -> None:
        if self._sub is not None:
            await bus.quietly(self._sub.unsubscribe())

    async def _chunk(self, msg) -> None:
        try:
            chunk = decode(msg.data, OutputChunk)
        except errors.SchemaError:
            return
        await self.blocks.add(chunk)

    async def _media(self, media: BlockMedia) -> None:
        for viewer in list(self.viewers):
            viewer.media(media)


class Feeds:
    """The feeds of the sessions watched here: made with a session's first viewer, ended with its last."""

    def __init__(self, nc: bus.Client) -> None:
        self.nc = nc
        self.by_session: dict[str, SessionFeed] = {}
        self._lock = asyncio.Lock()  # a join never finds a feed still subscribing or already unsubscribing

    async def join(self, session_id: str, viewer: Viewer) -> SessionFeed:
        async with self._lock:
            feed = self.by_session.get(session_id)
            if feed is None:
                feed = SessionFeed(self.nc, session_id)
                await feed.start()
                self.by_session[session_id] = feed
            feed.viewers.append(viewer)
            return feed

    async def leave(self, session_id: str, viewer: Viewer) -> None:
        async with self._lock:
            feed = self.by_session.get(session_id)
            if feed is None or viewer not in feed.viewers:
                return
            feed.viewers.remove(viewer)
            if not feed.viewers:
                del self.by_session[session_id]
                await feed.stop()
