"""`StatefleetVideoService` in a Pipecat pipeline (Pipecat's own `run_test`) over a real stack: TTS audio
in gives image and audio frames out, in order, the audio exactly what went in; an InterruptionFrame
is answered by `cleared` and nothing stale plays after it; a SIGKILL of the owning engine host
mid-utterance resumes the stream with no audio lost or repeated."""

from __future__ import annotations

import asyncio
import signal

import numpy as np
import pytest

pytest.importorskip("pipecat", reason="the statefleet[pipecat] extra is not installed")

from pipecat.frames.frames import (  # noqa: E402
    InterruptionFrame,
    OutputAudioRawFrame,
    OutputImageRawFrame,
    TTSAudioRawFrame,
    TTSStoppedFrame,
)
from pipecat.tests.utils import SleepFrame, run_test  # noqa: E402

from libs.audio_resample import Resampler  # noqa: E402
from libs.fence.ownership import assign, read_owner  # noqa: E402
from statefleet.integrations.pipecat import StatefleetVideoService  # noqa: E402
from tests.support.ownership import claimed_by  # noqa: E402
from tests.support.voice import serving  # noqa: E402
from tests.support.waiting import STARTING, eventually  # noqa: E402
from tests.voice.helpers import tone  # noqa: E402

pytestmark = pytest.mark.slow


def tts(pcm: np.ndarray, rate: int, chunk_s: float = 0.02) -> list[TTSAudioRawFrame]:
    """As a TTS service emits it: short chunks, faster than real time."""
    step = int(rate * chunk_s)
    return [TTSAudioRawFrame(audio=pcm[i:i + step].tobytes(), sample_rate=rate, num_channels=1)
            for i in range(0, pcm.shape[0], step)]


def media(frames) -> tuple[list[type], np.ndarray]:
    kinds = [type(f) for f in frames if isinstance(f, (OutputImageRawFrame, OutputAudioRawFrame))]
    audio = [np.frombuffer(f.audio, dtype="<i2") for f in frames if isinstance(f, OutputAudioRawFrame)]
    return kinds, np.concatenate(audio) if audio else np.zeros(0, np.int16)


async def one_host_service(nc, fence, hosts, sid: str, event: str) -> tuple[StatefleetVideoService, list]:
    """A service over a session on one host, and the list its `event` handler fills."""
    h1 = hosts("h1")
    await h1.ready(nc)
    stream, _ = await serving(nc, fence, "h1", sid)
    service = StatefleetVideoService(stream=stream)
    seen: list = []

    @service.event_handler(event)
    async def on_event(_service, e):
        seen.append(e)

    return service, seen


async def test_tts_audio_in_gives_images_and_the_same_audio_out_in_order(nc, fence, hosts):
    service, done = await one_host_service(nc, fence, hosts, "pc1", "on_segment_done")
    speech = tone(1.2, freq=210, rate=24000)
    down, _ = await run_test(service, frames_to_send=[*tts(speech, 24000), TTSStoppedFrame()])
    kinds, audio = media(down)
    assert np.array_equal(audio, Resampler(24000, 16000).feed(speech))
    assert kinds[0] is OutputImageRawFrame and OutputAudioRawFrame in kinds
    # every audio frame follows the image it plays under: never two audio frames in a row
    assert all(not (a is OutputAudioRawFrame and b is OutputAudioRawFrame) for a, b in zip(kinds, kinds[1:], strict=False))
    assert len(done) == 1 and done[0].segment_played == audio.shape[0]
    assert any(isinstance(f, TTSStoppedFrame) for f in down)
    assert not any(isinstance(f, TTSAudioRawFrame) for f in down)  # the avatar's audio replaces the TTS's


async def test_an_interruption_clears_what_has_not_played(nc, fence, hosts):
    service, cleared = await one_host_service(nc, fence, hosts, "pc2", "on_cleared")
    speech = tone(5.0, freq=180)
    down, _ = await run_test(service, frames_to_send=[*tts(speech, 16000), SleepFrame(sleep=1.0), InterruptionFrame()])
    _, audio = media(down)
    assert len(cleared) == 1
    assert np.array_equal(audio, speech[: audio.shape[0]]) and audio.shape[0] < speech.shape[0]
    assert cleared[0].segment_played == audio.shape[0]  # nothing stale played after the clear
    assert any(isinstance(f, InterruptionFrame) for f in down)


async def test_a_sigkill_of_the_owner_mid_utterance_resumes_the_stream(nc, fence, hosts):
    h1, h2 = hosts("h1"), hosts("h2")
    await asyncio.gather(h1.ready(nc), h2.ready(nc))
    stream, _ = await serving(nc, fence, "h1", "pc3")
    service = StatefleetVideoService(stream=stream, drain_timeout_s=90)
    speech = tone(5.0, freq=230)
    running = asyncio.create_task(run_test(service, frames_to_send=[*tts(speech, 16000), TTSStoppedFrame()]))
    await eventually(lambda: _past(stream, 14), timeout_s=60, what="2 s of output", tolerate=STARTING)
    v1 = (await read_owner(nc.jetstream(), "pc3")).view.owner.version
    h1.signal(signal.SIGKILL)
    await assign(nc, "pc3", "h2", expect_version=v1)
    await eventually(lambda: claimed_by(nc, "pc3", "h2"), what="h2's claim", tolerate=STARTING)
    down, _ = await asyncio.wait_for(running, 120)
    _, audio = media(down)
    assert np.array_equal(audio, speech)  # every sample once, in order, across the owner change
    assert stream.assembler.skipped == 0


async def _past(stream, blocks: int) -> bool:
    first = stream.assembler.first_block
    return first is not None and stream.assembler.next_block - first >= blocks
