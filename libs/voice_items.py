"""Checking the items a voice agent sends (`audio`, `clear`, `segment_end`): shared by fence's ingress,
which refuses a bad one with a typed 4xx before storing it, and the backend, which parses what was
stored. One function per kind, so the door and the engine can never disagree on what is valid."""

from __future__ import annotations

import base64
import binascii
from typing import Any

import msgspec

from libs.errors import BadRequest, SchemaError, TooLarge, UnsupportedInput
from libs.schemas.engine import AUDIO_SAMPLE_RATE
from libs.schemas.voice import AudioChunk, ClearItem, SegmentEnd

CONTROL_KINDS = frozenset({"clear", "segment_end"})
_chunk = msgspec.json.Decoder(AudioChunk | str)
_controls: dict[str, msgspec.json.Decoder[ClearItem] | msgspec.json.Decoder[SegmentEnd]] = {"clear": msgspec.json.Decoder(ClearItem),
                                              "segment_end": msgspec.json.Decoder(SegmentEnd)}


def audio_pcm(data: bytes, *, max_samples: int, sample_rate: int = AUDIO_SAMPLE_RATE, **where: Any) -> bytes:
    """The int16 LE mono PCM an `audio` item carries (an `AudioChunk` or a bare base64 string)."""
    try:
        value = _chunk.decode(data)
    except msgspec.ValidationError as e:
        raise SchemaError(f"audio data: {e}", field="data", **where) from None
    except msgspec.DecodeError:
        raise BadRequest("audio data is not JSON", field="data", **where) from None
    if isinstance(value, str):
        try:
            raw = base64.b64decode(value, validate=True)
        except binascii.Error:
            raise BadRequest("audio data is not base64", field="data", **where) from None
    else:
        if value.sample_rate != sample_rate:
            raise UnsupportedInput(f"audio at {value.sample_rate} Hz: this backend takes {sample_rate} Hz "
                                   "(resample first; statefleet.client does)", field="data.sample_rate",
                                   sample_rate=value.sample_rate, **where)
        if value.channels != 1:
            raise UnsupportedInput(f"audio with {value.channels} channels: this backend takes mono",
                                   field="data.channels", **where)
        raw = value.pcm
    if not raw:
        raise BadRequest("an audio item needs at least one sample", field="data", **where)
    if len(raw) % 2:
        raise BadRequest("audio is int16 PCM: an even number of bytes", field="data", size=len(raw), **where)
    if len(raw) // 2 > max_samples:
        raise TooLarge(f"audio of {len(raw) // 2} samples exceeds {max_samples} per item", size=len(raw),
                       max_samples=max_samples, **where)
    return raw


def control(kind: str, data: bytes, **where: Any) -> ClearItem | SegmentEnd:
    """A `clear` or `segment_end` item's typed value."""
    dec = _controls.get(kind)
    if dec is None:
        raise UnsupportedInput(f"{kind} is not a control item", field="kind", **where)
    try:
        msg = dec.decode(data)
    except msgspec.DecodeError as e:
        raise SchemaError(f"{kind} data: {e}", field="data", **where) from None
    if msg.v != 1:
        raise SchemaError(f"{kind} v{msg.v} is not supported (1)", field="data.v", **where)
    return msg  # type: ignore[no-any-return]  # one of the two decoders above


def audio_item_bytes(max_samples: int) -> int:
    """The largest `data` of an audio item carrying `max_samples` (an `AudioChunk` with its fields)."""
    return 4 * -(-2 * max_samples // 3) + 128
