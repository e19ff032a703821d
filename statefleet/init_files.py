"""Init inputs from files for `statefleet session create`: an image as binary PPM, audio as WAV.

Both are what the create API carries without decoding anything on the server: PPM (P6, 8-bit) is
row-major RGB behind a short header (`ffmpeg -i in.png out.ppm`, `convert in.jpg out.ppm`), and
a 16 kHz mono 16-bit WAV holds the int16 LE PCM the API takes (`ffmpeg -i in.mp3 -ar 16000 -ac 1
out.wav`). Anything else is refused with a typed error naming the file.
"""

from __future__ import annotations

import base64
import re
import wave
from pathlib import Path
from typing import Any

from libs.errors import BadRequest
from libs.schemas.engine import AUDIO_SAMPLE_RATE

_PPM = re.compile(rb"P6\s+(?:#[^\n]*\s+)*(\d+)\s+(?:#[^\n]*\s+)*(\d+)\s+(?:#[^\n]*\s+)*(\d+)\s")


def read_image(path: str) -> dict[str, Any]:
    """The create body's `image` ({width, height, rgb as base64}) of a binary PPM file."""
    data = _read(path)
    m = _PPM.match(data)
    if m is None or int(m.group(3)) != 255:
        raise BadRequest(f"{path} is not a binary PPM (P6) of 8-bit RGB", field="image", path=path)
    w, h = int(m.group(1)), int(m.group(2))
    rgb = data[m.end():]
    if len(rgb) != w * h * 3:
        raise BadRequest(f"{path}: a {w}×{h} PPM needs {w * h * 3} bytes of pixels, it has {len(rgb)}",
                         field="image", path=path)
    return {"width": w, "height": h, "rgb": base64.b64encode(rgb).decode()}


def read_audio(path: str) -> str:
    """The create body's `audio` (base64 int16 LE PCM) of a 16 kHz mono 16-bit WAV file."""
    try:
        with wave.open(path, "rb") as f:
            shape = (f.getframerate(), f.getnchannels(), f.getsampwidth())
            pcm = f.readframes(f.getnframes())
    except (OSError, EOFError, wave.Error) as e:
        raise BadRequest(f"{path} is not a readable WAV file: {e}", field="audio", path=path) from None
    if shape != (AUDIO_SAMPLE_RATE, 1, 2):
        raise BadRequest(f"{path} is {shape[0]} Hz, {shape[1]} channel(s), {8 * shape[2]}-bit; the API takes "
                         f"{AUDIO_SAMPLE_RATE} Hz mono 16-bit", field="audio", path=path)
    return base64.b64encode(pcm).decode()


def _read(path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise BadRequest(f"cannot read {path}: {e.strerror}", field="image", path=path) from None
