"""`AvatarStream` against a real stack: what comes out is exactly the audio that went in (resampled),
in order, once, with frames; `segment_end` and `clear` are answered; bad input sent while it plays is
refused and changes nothing it plays; and a SIGKILL of the owning engine host mid-utterance loses and
repeats nothing."""

from __future__ import annotations

import asyncio
import base64
import signal

import numpy as np
import pytest

from libs.fence.ownership import assign, read_owner
from statefleet.client import AvatarStream, Resampler
from tests.support.fence import post
from tests.support.ownership import claimed_by
from tests.support.voice import BACKEND, register, serving
from tests.support.waiting import STARTING, eventually
from tests.voice.helpers import tone

pytestmark = pytest.mark.slow


async def collect(stream: AvatarStream, until, timeout_s: float = 60.0) -> list:
    """Blocks until `until(blocks)` holds."""
    blocks = []

    async def run():
        async for b in stream:
            blocks.append(b)
            if until(blocks):
                return

    await asyncio.wait_for(run(), timeout_s)
    return blocks


def events(blocks, kind: str):
    return [e for b in blocks for e in b.events if e.event == kind]


def played(blocks) -> np.ndarray:
    return np.concatenate([b.audio for b in blocks]) if blocks else np.zeros(0, np.int16)


async def test_audio_in_gives_the_same_audio_and_frames_out_and_controls_are_answered(nc, fence, hosts):
    h1 = hosts("h1")
    await h1.ready(nc)
    stream, _ = await serving(nc, fence, "h1", "voice1", lead_s=0.4)
    try:
        speech = tone(1.5, freq=170, rate=24000)
        expected = Resampler(24000, 16000).feed(speech)
        await stream.push_audio(speech.tobytes(), sample_rate=24000)
        seg = await stream.end_segment()
        blocks = await collect(stream, lambda bs: bool(events(bs, "segment_done")))
        assert [b.block for b in blocks] == list(range(blocks[0].block, blocks[0].block + len(blocks)))
        assert np.array_equal(played(blocks), expected)  # nothing lost, repeated or reordered
        done = events(blocks, "segment_done")
        assert [(e.seq, e.segment_played) for e in done] == [(seg, len(expected))]
        assert all(b.frames.shape == (4, 3, 128, 128) and b.audio.shape[0] <= BACKEND.samples_per_block
                   for b in blocks)

        # barge-in: a clear mid-utterance drops the rest; nothing stale plays after its block
        long = tone(4.0, freq=200)
        pushing = asyncio.create_task(stream.push_audio(long.tobytes()))
        first = await collect(stream, lambda bs: played(bs).shape[0] >= 8000)
        seq = await stream.clear(reason="user_started_speaking")
        sent = await pushing
        rest = await collect(stream, lambda bs: bool(events(bs, "cleared")))
        tail = await collect(stream, lambda bs: len(bs) >= 3)
        cleared = events(rest, "cleared")[0]
        assert (cleared.seq, cleared.reason, cleared.interrupted) == (seq, "user_started_speaking", True)
        heard = np.concatenate([played(first), played(rest)])
        assert np.array_equal(heard, long[: heard.shape[0]])  # a prefix of the utterance, in order
        assert cleared.segment_played == heard.shape[0]
        assert heard.shape[0] + cleared.dropped == sent < long.shape[0]  # the rest was never sent at all
        assert played(tail).shape[0] == 0  # idle frames after the clear
        assert stream.resends == 0 and not stream.rejected
    finally:
        await stream.close()


def _audio(pcm: np.ndarray, rate: int = 16000) -> dict:
    return {"kind": "audio", "data": {"pcm": base64.b64encode(pcm.astype("<i2").tobytes()).decode(),
                                      "sample_rate": rate}}


async def test_bad_input_while_it_plays_is_refused_and_the_session_plays_on_unchanged(nc, fence, hosts, http):
    h1 = hosts("h1")
    await h1.ready(nc)
    stream, token = await serving(nc, fence, "h1", "voice3", lead_s=0.5)
    other = await register(nc, "voice3-other")
    try:
        speech = tone(2.0, freq=210)
        pushing = asyncio.create_task(stream.push_audio(speech))
        first = await collect(stream, lambda bs: played(bs).shape[0] > 0)
        bad = [(_audio(tone(0.1, rate=24000), rate=24000), 422), (_audio(tone(1.5)), 413),  # rate, size
               ({"kind": "audio", "data": {"pcm": "", "sample_rate": 16000}}, 400),  # empty
               ({"kind": "audio", "data": base64.b64encode(b"\x01\x02\x03").decode()}, 400)]  # half a sample
        for body, status in bad:
            assert (await post(http, fence, "voice3", token, body))[0] == status
        for kind in ("clear", "segment_end"):  # another session's token
            assert (await post(http, fence, "voice3", other, {"kind": kind, "data": {}}))[0] in (401, 403)
        await pushing
        seg = await stream.end_segment()
        rest = await collect(stream, lambda bs: bool(events(bs, "segment_done")))
        blocks = first + rest
        assert np.array_equal(played(blocks), speech)  # every good sample, once, in order: nothing else
        assert [e.seq for e in events(blocks, "segment_done")] == [seg] and not events(blocks, "cleared")
        items = -(-speech.shape[0] // stream.chunk_samples)
        assert seg == items + 1 and not stream.rejected  # the refused items took no seq, none reached the engine
    finally:
        await stream.close()


async def test_sigkill_of_the_owner_mid_utterance_loses_and_repeats_no_audio(nc, fence, hosts):
    h1, h2 = hosts("h1"), hosts("h2")
    await asyncio.gather(h1.ready(nc), h2.ready(nc))
    stream, _ = await serving(nc, fence, "h1", "voice2", lead_s=0.5)
    try:
        speech = tone(6.0, freq=190)
        pushing = asyncio.create_task(stream.push_audio(speech))
        before = await collect(stream, lambda bs: played(bs).shape[0] >= 2 * 16000)  # past a checkpoint
        v1 = (await read_owner(nc.jetstream(), "voice2")).view.owner.version
        h1.signal(signal.SIGKILL)
        await assign(nc, "voice2", "h2", expect_version=v1)
        await eventually(lambda: claimed_by(nc, "voice2", "h2"), what="h2's claim", tolerate=STARTING)
        await pushing
        seg = await stream.end_segment()
        after = await collect(stream, lambda bs: bool(events(bs, "segment_done")), timeout_s=90)
        blocks = before + after
        assert [b.block for b in blocks] == list(range(blocks[0].block, blocks[0].block + len(blocks)))
        assert np.array_equal(played(blocks), speech)
        assert [e.seq for e in events(blocks, "segment_done")] == [seq for seq in [seg]]
        assert stream.assembler.skipped == 0
    finally:
        await stream.close()
