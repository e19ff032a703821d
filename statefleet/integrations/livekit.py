"""A statefleet avatar for LiveKit Agents (`statefleet[livekit]`), in local-runner mode.

    avatar = StatefleetAvatarSession(stream=stream)      # an AvatarStream over a talking_head session
    await avatar.start(session, room=ctx.room)           # before session.start(...)

The agent's TTS audio goes to a `QueueAudioOutput` instead of the room; an `AvatarRunner` in the
agent's own process reads it into `StatefleetVideoGenerator`, which sends it through the stream
and yields the avatar's frames and the same audio, lip-synced, for the runner's `AVSynchronizer`
to publish as the room's video and audio tracks. An interruption (`clear_buffer`) clears the
stream; a segment end comes back as `AudioSegmentEnd` once its audio has played out, and the
runner reports `playback_finished` to the agent.

Remote mode (the avatar as its own participant, as the hosted providers run it) needs a worker
that joins the room with a token, receives the agent's audio over a `DataStreamAudioReceiver`
and runs the same `AvatarRunner` + `StatefleetVideoGenerator` there: docs/voice-agents.md.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import numpy as np
from livekit import rtc
from livekit.agents.voice.avatar import (
    AudioSegmentEnd,
    AvatarOptions,
    AvatarRunner,
    AvatarSession,
    QueueAudioOutput,
    VideoGenerator,
)

from libs.schemas.engine import AUDIO_SAMPLE_RATE
from libs.schemas.voice import VoiceEvent
from statefleet.client import AvatarStream

FPS = 25.0  # the talking head's default; the generator follows each block's own media length


class StatefleetVideoGenerator(VideoGenerator):
    def __init__(self, stream: AvatarStream) -> None:
        self.stream = stream
        self.segments: set[int] = set()  # segment ends sent, not yet played out
        self.cleared = 0
        self.last_cleared: VoiceEvent | None = None  # the last `cleared` event (its playback position, what it dropped)

    async def push_audio(self, frame: rtc.AudioFrame | AudioSegmentEnd) -> None:
        if isinstance(frame, AudioSegmentEnd):
            self.segments.add(await self.stream.end_segment())
            return
        await self.stream.push_audio(bytes(frame.data.cast("B")), frame.sample_rate, channels=frame.num_channels)

    async def clear_buffer(self) -> None:
        self.segments.clear()  # interrupted segments end with the clear, not with segment_done
        await self.stream.clear("interruption")
        self.cleared += 1

    def __aiter__(self) -> AsyncIterator[rtc.VideoFrame | rtc.AudioFrame | AudioSegmentEnd]:
        return self._frames()

    async def _frames(self) -> AsyncIterator[rtc.VideoFrame | rtc.AudioFrame | AudioSegmentEnd]:
        async for block in self.stream:
            n, _, h, w = block.frames.shape
            per_frame = int(round(AUDIO_SAMPLE_RATE * block.media_s / n))
            rgba = np.full((n, h, w, 4), 255, dtype=np.uint8)
            rgba[..., :3] = block.frames.transpose(0, 2, 3, 1)
            for i in range(n):
                yield rtc.VideoFrame(w, h, rtc.VideoBufferType.RGBA, rgba[i].tobytes())
                pcm = block.audio[i * per_frame:(i + 1) * per_frame]
                if pcm.shape[0]:
                    yield rtc.AudioFrame(pcm.astype("<i2").tobytes(), AUDIO_SAMPLE_RATE, 1, pcm.shape[0])
            for event in block.events:
                if event.event == "cleared":
                    self.last_cleared = event
                elif event.event == "segment_done" and event.seq in self.segments:
                    self.segments.discard(event.seq)
                    yield AudioSegmentEnd()


class StatefleetAvatarSession(AvatarSession):
    """Local-runner mode: the runner publishes the avatar's tracks as the agent's own participant."""

    def __init__(self, *, stream: AvatarStream, width: int = 128, height: int = 128) -> None:
        super().__init__()
        self.stream = stream
        self.generator = StatefleetVideoGenerator(stream)
        self.options = AvatarOptions(video_width=width, video_height=height, video_fps=FPS,
                                     audio_sample_rate=AUDIO_SAMPLE_RATE, audio_channels=1)
        self.audio_output = QueueAudioOutput(sample_rate=AUDIO_SAMPLE_RATE)
        self.runner: AvatarRunner | None = None

    @property
    def avatar_identity(self) -> str:
        room = self._room
        return room.local_participant.identity if room is not None and room.isconnected() else ""

    @property
    def provider(self) -> str:
        return "statefleet"

    async def start(self, agent_session, room: rtc.Room) -> None:
        """Route the agent's audio to the avatar and start the runner (no participant joins)."""
        self._room, self._agent_session = room, agent_session
        agent_session.output.audio = self.audio_output
        self.runner = AvatarRunner(room, audio_recv=self.audio_output, video_gen=self.generator, options=self.options)
        await self.runner.start()

    async def aclose(self) -> None:
        if self.runner is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self.runner.aclose()
        await self.stream.close()
        self._room = self._agent_session = None
