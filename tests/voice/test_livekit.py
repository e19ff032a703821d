"""`StatefleetVideoGenerator` with LiveKit's own pieces and no server: the agent's audio through a
`QueueAudioOutput`, the generator over a real stack, its frames into an `AVSynchronizer` over an
`AudioSource` and a `VideoSource` (as `AvatarRunner` wires them; the runner itself publishes to a
room, which needs a LiveKit server). The audio out is exactly the audio in, a segment end comes back
after its audio, and `clear_buffer` stops playback with nothing stale after it."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

pytest.importorskip("livekit.agents", reason="the statefleet[livekit] extra is not installed")

from livekit import rtc  # noqa: E402
from livekit.agents.voice.avatar import AudioSegmentEnd, QueueAudioOutput  # noqa: E402

from libs.audio_resample import Resampler  # noqa: E402
from statefleet.integrations.livekit import FPS, StatefleetVideoGenerator  # noqa: E402
from tests.support.voice import serving  # noqa: E402
from tests.support.waiting import STARTING, eventually  # noqa: E402
from tests.voice.helpers import tone  # noqa: E402

pytestmark = pytest.mark.slow


class Runner:
    """What AvatarRunner does between its audio receiver, the generator and its synchronizer."""

    def __init__(self, queue: QueueAudioOutput, gen: StatefleetVideoGenerator) -> None:
        self.queue, self.gen = queue, gen
        self.sync = rtc.AVSynchronizer(audio_source=rtc.AudioSource(16000, 1), video_source=rtc.VideoSource(128, 128),
                                       video_fps=FPS)
        self.out: list = []
        self.tasks = [asyncio.create_task(self._read()), asyncio.create_task(self._forward())]
        queue.on("clear_buffer", lambda: self.tasks.append(asyncio.create_task(gen.clear_buffer())))

    async def _read(self) -> None:
        async for frame in self.queue:
            await self.gen.push_audio(frame)

    async def _forward(self) -> None:
        async for frame in self.gen:
            self.out.append(frame)
            if not isinstance(frame, AudioSegmentEnd):
                await self.sync.push(frame)

    def audio(self) -> np.ndarray:
        pcm = [np.frombuffer(bytes(f.data.cast("B")), dtype="<i2") for f in self.out if isinstance(f, rtc.AudioFrame)]
        return np.concatenate(pcm) if pcm else np.zeros(0, np.int16)

    async def close(self) -> None:
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await self.sync.aclose()


async def say(queue: QueueAudioOutput, pcm: np.ndarray, rate: int) -> None:
    step = rate // 50  # 20 ms frames, as a TTS node emits them
    for i in range(0, pcm.shape[0], step):
        chunk = pcm[i:i + step]
        await queue.capture_frame(rtc.AudioFrame(chunk.tobytes(), rate, 1, chunk.shape[0]))
    queue.flush()


async def test_the_generator_returns_the_agents_audio_lip_synced_and_answers_clear(nc, fence, hosts):
    h1 = hosts("h1")
    await h1.ready(nc)
    stream, _ = await serving(nc, fence, "h1", "lk1")
    queue = QueueAudioOutput(sample_rate=24000)
    gen = StatefleetVideoGenerator(stream)
    runner = Runner(queue, gen)
    try:
        speech = tone(1.2, freq=220, rate=24000)
        await say(queue, speech, 24000)
        await eventually(lambda: _ended(runner), timeout_s=60, what="the segment's end", tolerate=STARTING)
        assert np.array_equal(runner.audio(), Resampler(24000, 16000).feed(speech))
        kinds = [type(f) for f in runner.out]
        end = kinds.index(AudioSegmentEnd)
        assert kinds[0] is rtc.VideoFrame and kinds.count(AudioSegmentEnd) == 1
        assert rtc.AudioFrame not in kinds[end:]  # the end comes after the segment's last audio
        assert all(f.width == 128 and f.height == 128 for f in runner.out if isinstance(f, rtc.VideoFrame))

        before = runner.audio().shape[0]
        long = tone(4.0, freq=180)
        speaking = asyncio.create_task(say(queue, long, 16000))
        await eventually(lambda: _heard(runner, before + 4000), timeout_s=60, what="the second utterance", tolerate=STARTING)
        queue.clear_buffer()
        await eventually(lambda: _cleared(gen), timeout_s=60, what="cleared", tolerate=STARTING)
        speaking.cancel()
        heard = runner.audio()[before:]
        assert np.array_equal(heard, long[: heard.shape[0]]) and heard.shape[0] < long.shape[0]
        assert gen.last_cleared.segment_played == heard.shape[0]  # nothing stale after the clear
    finally:
        await runner.close()
        await stream.close()


async def _ended(runner: Runner) -> bool:
    return any(isinstance(f, AudioSegmentEnd) for f in runner.out)


async def _heard(runner: Runner, samples: int) -> bool:
    return runner.audio().shape[0] >= samples


async def _cleared(gen: StatefleetVideoGenerator) -> bool:
    return gen.last_cleared is not None
