"""`StatefleetVideoService`: a statefleet avatar as a Pipecat frame processor (`statefleet[pipecat]`).

Place it between the TTS and the transport's output, as Pipecat's own avatar services sit:

    Pipeline([transport.input(), stt, llm, tts, StatefleetVideoService(stream=stream), transport.output()])

- `TTSAudioRawFrame`s go to the avatar (any rate; resampled and paced by `AvatarStream`) and are
  not passed on: the avatar returns the same audio, lip-synced, as `OutputAudioRawFrame`s, each
  after the `OutputImageRawFrame` of the video frame it plays under (40 ms of audio per image).
- `TTSStoppedFrame` ends the segment (`segment_done` comes back once its audio has played out).
- `InterruptionFrame` / `UserStartedSpeakingFrame` clear: audio not yet played is dropped here, at
  fence and in the engine, and `cleared` comes back.
- `EndFrame` waits (up to `drain_timeout_s`) for the segments ended so far to finish playing and
  the clears sent to be answered.

Events: `on_cleared(service, event)` and `on_segment_done(service, event)` (a `VoiceEvent`).
Audio reaches the stream from a task of its own, so pacing never holds the pipeline and an
interruption is acted on at once.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque

import numpy as np
from pipecat.frames.frames import (
    CancelFrame,
    EndFrame,
    Frame,
    InterruptionFrame,
    OutputAudioRawFrame,
    OutputImageRawFrame,
    StartFrame,
    TTSAudioRawFrame,
    TTSStoppedFrame,
    UserStartedSpeakingFrame,
)
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor

from libs.schemas.engine import AUDIO_SAMPLE_RATE
from statefleet.client import AvatarBlock, AvatarStream

_END = object()  # a segment end in the send queue


class StatefleetVideoService(FrameProcessor):
    def __init__(self, *, stream: AvatarStream, drain_timeout_s: float = 30.0, **kwargs) -> None:
        super().__init__(**kwargs)
        self.stream = stream
        self.drain_timeout_s = drain_timeout_s
        self._sends: deque = deque()  # audio (pcm, rate, channels) and _END, in arrival order
        self._wake = asyncio.Event()
        self._sender: asyncio.Task | None = None
        self._receiver: asyncio.Task | None = None
        self._awaiting: set[int] = set()  # seqs of control items sent and not yet answered
        self._settled = asyncio.Event()
        self._settled.set()
        self._ending = 0  # segment ends queued, not yet sent
        self._register_event_handler("on_cleared")
        self._register_event_handler("on_segment_done")

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, StartFrame):
            await self.push_frame(frame, direction)
            await self._start()
        elif isinstance(frame, TTSAudioRawFrame):
            self._queue((frame.audio, frame.sample_rate, frame.num_channels))
        elif isinstance(frame, TTSStoppedFrame):
            self._ending += 1
            self._settled.clear()
            self._queue(_END)
            await self.push_frame(frame, direction)
        elif isinstance(frame, (InterruptionFrame, UserStartedSpeakingFrame)):
            await self._clear("user_started_speaking" if isinstance(frame, UserStartedSpeakingFrame) else "interruption")
            await self.push_frame(frame, direction)
        elif isinstance(frame, EndFrame):
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._settled.wait(), self.drain_timeout_s)
            await self._stop()
            await self.push_frame(frame, direction)
        elif isinstance(frame, CancelFrame):
            await self._stop()
            await self.push_frame(frame, direction)
        else:
            await self.push_frame(frame, direction)

    async def _start(self) -> None:
        if self._sender is None:
            self._sender = self.create_task(self._send())
            self._receiver = self.create_task(self._receive())

    async def _stop(self) -> None:
        for task in (self._sender, self._receiver):
            if task is not None:
                await self.cancel_task(task)
        self._sender = self._receiver = None
        await self.stream.close()

    async def _clear(self, reason: str) -> None:
        while self._sends:  # not sent yet: dropped here
            if self._sends.popleft() is _END:
                self._ending -= 1
        self._awaiting.clear()  # the segments it interrupts are never answered: `cleared` answers for them
        self._settled.clear()
        self._awaiting.add(await self.stream.clear(reason))

    def _queue(self, item) -> None:
        self._sends.append(item)
        self._wake.set()

    async def _send(self) -> None:
        while True:
            while not self._sends:
                self._wake.clear()
                await self._wake.wait()
            item = self._sends.popleft()
            if item is _END:
                self._awaiting.add(await self.stream.end_segment())
                self._ending -= 1
            else:
                pcm, rate, channels = item
                # a TTS emits 10-40 ms frames: what queued while the last item was stored goes as one
                while self._sends and self._sends[0] is not _END and self._sends[0][1:] == (rate, channels):
                    pcm += self._sends.popleft()[0]
                await self.stream.push_audio(pcm, rate, channels=channels)

    async def _receive(self) -> None:
        async for block in self.stream:
            await self._play(block)
            for event in block.events:
                self._awaiting.discard(event.seq)
                await self._call_event_handler(f"on_{event.event}", event)
                if not self._awaiting and not self._ending:
                    self._settled.set()

    async def _play(self, block: AvatarBlock) -> None:
        """Each video frame, then the audio that plays under it (silence past what the block consumed is
        not sent: the transport plays nothing there)."""
        n, _, h, w = block.frames.shape
        per_frame = block.audio.shape[0] and int(round(AUDIO_SAMPLE_RATE * block.media_s / n))
        for i in range(n):
            image = np.ascontiguousarray(block.frames[i].transpose(1, 2, 0)).tobytes()
            await self.push_frame(OutputImageRawFrame(image=image, size=(w, h), format="RGB"))
            pcm = block.audio[i * per_frame:(i + 1) * per_frame] if per_frame else block.audio[:0]
            if pcm.shape[0]:
                await self.push_frame(OutputAudioRawFrame(audio=pcm.astype("<i2").tobytes(),
                                                          sample_rate=AUDIO_SAMPLE_RATE, num_channels=1))
