"""Speech for the text avatar: Debian's `espeak-ng` turns a chunk's text into 16 kHz mono int16 PCM.

espeak-ng is a formant synthesizer: no model weights, the same samples for the same text, voice,
rate and version (a session is bit-exact on hosts that install the same package, as T0 asks of
hosts configured alike). It runs as a separate program (GPL-3.0-or-later; statefleet links
nothing of it: docs/decisions.md), on the encode stage's thread, which the event loop never waits on.
"""

from __future__ import annotations

import io
import shutil
import subprocess
import wave

import numpy as np
import torch

from libs.audio_resample import Resampler
from libs.errors import ConfigError
from libs.schemas.engine import AUDIO_SAMPLE_RATE

TIMEOUT_S = 10.0


class Espeak:
    def __init__(self, *, voice: str = "en-us", words_per_minute: int = 160, pitch: int = 50) -> None:
        self.program = shutil.which("espeak-ng")
        if self.program is None:
            raise ConfigError("the avatar's espeak voice needs Debian's espeak-ng (`make espeak`, or "
                              "apt-get install espeak-ng)", program="espeak-ng")
        self.args = [self.program, "--stdout", "-v", voice, "-s", str(words_per_minute), "-p", str(pitch), "-z"]
        self.version = subprocess.run([self.program, "--version"], capture_output=True, text=True,
                                      timeout=TIMEOUT_S, check=True).stdout.strip()

    def speak(self, text: str) -> torch.Tensor:
        """int16 [n] at AUDIO_SAMPLE_RATE; empty for text with nothing to say."""
        if not text.strip():
            return torch.zeros(0, dtype=torch.int16)
        done = subprocess.run([*self.args, "--", text], capture_output=True, timeout=TIMEOUT_S, check=True)
        with wave.open(io.BytesIO(done.stdout)) as w:
            rate, width, channels = w.getframerate(), w.getsampwidth(), w.getnchannels()
            frames = w.readframes(w.getnframes())
        if width != 2 or channels != 1:
            raise ConfigError(f"espeak-ng wrote {channels}-channel {8 * width}-bit audio, not mono int16")
        pcm = Resampler(rate, AUDIO_SAMPLE_RATE).feed(np.frombuffer(frames, dtype="<i2"))
        return torch.from_numpy(pcm.copy())
