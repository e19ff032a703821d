"""Audio and items for the voice tests: deterministic speech-like PCM and the three item kinds."""

from __future__ import annotations

import base64
import json
import math

import numpy as np

from libs.schemas.common import InputItem

RATE = 16000


def tone(seconds: float, *, freq: float = 180.0, amp: float = 0.5, rate: int = RATE, start: int = 0) -> np.ndarray:
    """int16 PCM: a voiced tone with a syllable-rate envelope (4 Hz), so loudness varies frame to frame."""
    n = int(round(seconds * rate))
    t = (np.arange(n) + start) / rate
    env = 0.5 - 0.5 * np.cos(2 * math.pi * 4.0 * t)
    return (amp * env * np.sin(2 * math.pi * freq * t) * 32767).round().astype(np.int16)


def audio_item(seq: int, pcm: np.ndarray, sid: str = "s", *, obj: bool = True, rate: int = RATE) -> InputItem:
    b64 = base64.b64encode(pcm.astype("<i2").tobytes()).decode()
    data = {"pcm": b64, "sample_rate": rate} if obj else b64
    return InputItem(session_id=sid, seq=seq, kind="audio", data=json.dumps(data).encode())


def control_item(seq: int, kind: str, sid: str = "s", **data) -> InputItem:
    return InputItem(session_id=sid, seq=seq, kind=kind, data=json.dumps(data).encode())
