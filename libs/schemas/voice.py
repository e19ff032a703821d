"""Voice-agent items and events: the audio a talking avatar takes, its two control items, and the
events it answers them with on the session's output stream.

Items (what a client POSTs as `{"kind": ..., "data": ...}`; `data` is the JSON of these structs):
- `audio`: an `AudioChunk` object, or (the original form) a bare JSON string of base64 PCM at
  `AUDIO_SAMPLE_RATE`. The object names its rate and format so a wrong one is refused at the door.
- `clear`: a `ClearItem`: drop every earlier item not yet played and the audio the backend buffers.
- `segment_end`: a `SegmentEnd`: the audio before it is one utterance; answer when it has played.

Events (output chunks of kind `event`, dtype `json`, one event per part) are `VoiceEvent`s. Like
every block's output they are published only once the block is journaled, so a replacement host
regenerates exactly the same events for the same blocks (marked `replayed`).
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from libs.schemas.base import Msg

AudioFormat = Literal["s16le"]
SampleCount = Annotated[int, msgspec.Meta(ge=0)]


class AudioChunk(Msg, forbid_unknown_fields=True):
    """`pcm`: base64 (in JSON) of interleaved int16 little-endian samples."""

    pcm: bytes
    sample_rate: int = 16000
    channels: int = 1
    format: AudioFormat = "s16le"


class ClearItem(Msg, forbid_unknown_fields=True):
    reason: Annotated[str, msgspec.Meta(max_length=64)] = ""  # e.g. "user_started_speaking"; echoed in `cleared`


class SegmentEnd(Msg, forbid_unknown_fields=True):
    """No fields yet: the `segment_done` that answers it names it by the item's seq."""


class VoiceEvent(Msg):
    """`cleared` (a clear was applied) or `segment_done` (a segment's audio has all been emitted).

    Positions are in samples at the backend's rate: `played` counts every sample the session has
    emitted so far, `segment_played` those of the current segment (what LiveKit calls the
    playback position); `dropped` what the clear threw away unplayed."""

    event: Literal["cleared", "segment_done"]
    seq: int  # the control item's input seq
    block: int  # the block that answered it
    sample_rate: int
    played: SampleCount = 0
    segment_played: SampleCount = 0
    dropped: SampleCount = 0
    interrupted: bool = False  # cleared: some audio of the segment was still unplayed
    reason: str = ""  # cleared: the clear's reason

    @property
    def playback_position_s(self) -> float:
        return self.segment_played / self.sample_rate
