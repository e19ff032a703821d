"""Typed input kinds a backend can take, parsed from a released `InputItem` with typed errors.

- `action`: keyboard and mouse, `{"keys": [...], "mouse": [dx, dy]}` (keys from the backend's set,
  |d| ≤ MOUSE_MAX), as world models take them per block;
- `audio`: a JSON string of base64 16 kHz mono int16 little-endian PCM, as talking-avatar models
  take their audio features per block;
- `text`: a JSON string.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass

import torch

from libs.errors import BadRequest, TooLarge
from libs.schemas.common import InputItem
from libs.schemas.engine import AUDIO_SAMPLE_RATE

MOUSE_MAX = 1000.0


@dataclass(frozen=True, slots=True)
class Action:
    keys: torch.Tensor  # float32 [len(key set)]: 1.0 for a key held
    mouse: torch.Tensor  # float32 [2]: dx, dy scaled to [-1, 1]


def _json(item: InputItem, kind: str):
    if item.kind != kind:
        raise BadRequest(f"this backend takes {kind} inputs, not {item.kind}", session_id=item.session_id,
                         seq=item.seq)
    try:
        return json.loads(item.data)
    except ValueError:
        raise BadRequest(f"{kind} data is not JSON", session_id=item.session_id, seq=item.seq) from None


def parse_action(item: InputItem, key_set: tuple[str, ...]) -> Action:
    value = _json(item, "action")
    where = {"session_id": item.session_id, "seq": item.seq}
    if not isinstance(value, dict) or set(value) - {"keys", "mouse"}:
        raise BadRequest('action must be an object with only "keys" and "mouse"', **where)
    keys, mouse = value.get("keys", []), value.get("mouse", [0, 0])
    if not isinstance(keys, list) or any(k not in key_set for k in keys):
        raise BadRequest(f"action keys must be a list drawn from {key_set}", **where)
    if (not isinstance(mouse, list) or len(mouse) != 2
            or any(isinstance(m, bool) or not isinstance(m, (int, float)) or not abs(m) <= MOUSE_MAX for m in mouse)):
        raise BadRequest(f"action mouse must be [dx, dy] with |d| <= {MOUSE_MAX}", **where)
    return Action(keys=torch.tensor([1.0 if k in keys else 0.0 for k in key_set]),
                  mouse=torch.tensor([m / MOUSE_MAX for m in mouse], dtype=torch.float32))


def parse_audio(item: InputItem, max_samples: int) -> torch.Tensor:
    """The item's PCM as float32 samples in [-1, 1] at AUDIO_SAMPLE_RATE."""
    value = _json(item, "audio")
    where = {"session_id": item.session_id, "seq": item.seq}
    if not isinstance(value, str):
        raise BadRequest("audio data must be a JSON string of base64 PCM", **where)
    try:
        raw = base64.b64decode(value, validate=True)
    except binascii.Error:
        raise BadRequest("audio data is not base64", **where) from None
    if len(raw) % 2:
        raise BadRequest(f"audio is {AUDIO_SAMPLE_RATE} Hz int16 PCM: an even number of bytes", **where)
    if len(raw) // 2 > max_samples:
        raise TooLarge(f"audio of {len(raw) // 2} samples exceeds {max_samples} per item", size=len(raw), **where)
    return pcm_samples(raw)


def pcm_samples(raw: bytes) -> torch.Tensor:
    """int16 little-endian PCM bytes as float32 samples in [-1, 1]."""
    if not raw:
        return torch.zeros(0)
    return torch.frombuffer(bytearray(raw), dtype=torch.int16).float() / 32768.0


def parse_text(item: InputItem, max_bytes: int) -> bytes:
    value = _json(item, "text")
    where = {"session_id": item.session_id, "seq": item.seq}
    if not isinstance(value, str):
        raise BadRequest("text data must be a JSON string", **where)
    raw = value.encode()
    if len(raw) > max_bytes:
        raise TooLarge(f"text of {len(raw)} bytes exceeds {max_bytes} per item", size=len(raw), **where)
    return raw
