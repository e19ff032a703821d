"""A session's output received and decoded once for all its WebRTC viewers on a fence instance (rtc_feed.py),
over a real nats-server: every viewer gets each block, the same decoded frames (shared, not decoded again),
already in the encoder's pixel format and true to the PNG; one subscription per session while it has
viewers, none after the last leaves; a viewer that joins a running feed starts with the next block."""

from __future__ import annotations

import av
import numpy as np

from libs import names, png
from libs.schemas.base import encode
from libs.schemas.engine import OutputChunk
from services.fence.rtc_feed import Feeds
from tests.support.waiting import eventually

FRAMES, SIDE, SAMPLES = 3, 16, 6400


class Collect:
    def __init__(self) -> None:
        self.got = []

    def media(self, media) -> None:
        self.got.append(media)

    def kinds(self, block: int) -> set[str]:
        return {m.kind for m in self.got if m.block == block}


def image(block: int) -> np.ndarray:
    """uint8 [F, 3, H, W]: a gradient that differs per block and frame."""
    y, x = np.mgrid[0:SIDE, 0:SIDE]
    return np.stack([np.stack([(x * 8 + block * 20 + f * 5) % 256, y * 8, np.full_like(x, 128)])
                     for f in range(FRAMES)]).astype(np.uint8)


async def publish(nc, session_id: str, block: int) -> None:
    frames = image(block)
    for i in range(FRAMES):
        await nc.publish(names.output_subject(session_id), encode(OutputChunk(
            session_id=session_id, block=block, kind="frames", dtype="uint8", shape=list(frames.shape), part=i,
            parts=FRAMES, data=png.encode(frames[i]), encoding="png", media_s=0.4)))
    await nc.publish(names.output_subject(session_id), encode(OutputChunk(
        session_id=session_id, block=block, kind="audio", dtype="int16", shape=[SAMPLES], part=0, parts=1,
        data=np.full(SAMPLES, block, np.int16).tobytes(), media_s=0.4)))


async def test_viewers_of_a_session_share_one_subscription_and_one_decode(nc):
    feeds = Feeds(nc)
    a, b, late = Collect(), Collect(), Collect()
    feed = await feeds.join("s1", a)
    assert await feeds.join("s1", b) is feed and len(feeds.by_session) == 1, "one feed per session"
    await publish(nc, "s1", 1)
    await eventually(lambda: a.kinds(1) == b.kinds(1) == {"frames", "audio"}, timeout_s=30, what="block 1 to both")
    fa, fb = (next(m for m in v.got if m.kind == "frames") for v in (a, b))
    assert fa is fb, "decoded once: both viewers hold the same block"
    assert fa.pixel_format == "yuv420p" and fa.frames.shape == (FRAMES, SIDE * 3 // 2, SIDE)
    assert fa.arrived_at > 0
    back = av.VideoFrame.from_ndarray(fa.frames[1], format="yuv420p").to_ndarray(format="rgb24")
    want = image(1)[1].transpose(1, 2, 0)
    assert np.abs(back.astype(int) - want).mean() < 8, "the converted frame is the PNG's picture"

    await feeds.join("s1", late)
    await publish(nc, "s1", 2)
    await eventually(lambda: late.kinds(2) == {"frames", "audio"} and a.kinds(2) == {"frames", "audio"},
                     timeout_s=30, what="block 2 to all three")
    assert late.kinds(1) == set(), "a viewer that joins plays from the next block"

    for v in (a, b, late):
        await feeds.leave("s1", v)
    assert feeds.by_session == {}, "no feed once the last viewer left"
    again = Collect()
    assert await feeds.join("s1", again) is not feed, "a later viewer gets a new feed"
    await feeds.leave("s1", again)


async def test_odd_sized_frames_stay_rgb_for_the_encoder(nc):
    feeds = Feeds(nc)
    v = Collect()
    await feeds.join("s2", v)
    frame = np.arange(3 * 5 * 7, dtype=np.uint8).reshape(1, 3, 5, 7)
    await nc.publish(names.output_subject("s2"), encode(OutputChunk(
        session_id="s2", block=1, kind="frames", dtype="uint8", shape=[1, 3, 5, 7], part=0, parts=1,
        data=png.encode(frame[0]), encoding="png", media_s=0.04)))
    await eventually(lambda: v.kinds(1) == {"frames"}, timeout_s=30, what="the odd-sized block")
    media = v.got[0]
    assert media.pixel_format == "rgb24" and np.array_equal(media.frames[0], frame[0].transpose(1, 2, 0))
    await feeds.leave("s2", v)
