"""Streaming audio conversion to the avatar's input: int16 PCM at any rate and channel count → 16 kHz
mono int16, chunk by chunk, continuous across chunks (the same samples whatever the chunking).

Linear interpolation, after a one-pole-per-octave box low-pass when downsampling: enough for lip
sync and for speech at telephone-plus quality, no dependency beyond numpy (docs/decisions.md)."""

from __future__ import annotations

import numpy as np


def as_int16(pcm: bytes | bytearray | memoryview | np.ndarray, channels: int = 1) -> np.ndarray:
    """Interleaved int16 PCM (bytes, little-endian, or an int16 array) as mono int16 (channels averaged)."""
    if isinstance(pcm, np.ndarray):
        if pcm.dtype != np.int16:
            raise ValueError(f"PCM arrays must be int16, not {pcm.dtype}")
        x = pcm.reshape(-1)
    else:
        raw = bytes(pcm)
        if len(raw) % (2 * channels):
            raise ValueError(f"PCM of {len(raw)} bytes is not whole int16 frames of {channels} channels")
        x = np.frombuffer(raw, dtype="<i2")
    if channels > 1:
        if x.shape[0] % channels:
            raise ValueError(f"{x.shape[0]} samples are not whole frames of {channels} channels")
        x = x.reshape(-1, channels).astype(np.int32).mean(axis=1).round().astype(np.int16)
    return x


class Resampler:
    """One stream's converter from `src` Hz to `dst` Hz; `feed` returns what the input so far yields."""

    def __init__(self, src: int, dst: int) -> None:
        if src <= 0 or dst <= 0:
            raise ValueError("sample rates must be positive")
        self.src, self.dst = src, dst
        self.step = src / dst
        self._pos = 0.0  # where the next output sample falls, in input samples after the last one kept
        self._prev: float | None = None  # the last input sample of the previous chunk (after filtering)
        taps = max(1, int(np.ceil(self.step))) if src > dst else 1
        self._taps = taps
        self._tail = np.zeros(taps - 1)  # the filter's history

    def feed(self, pcm: np.ndarray) -> np.ndarray:
        if self.src == self.dst:
            return pcm.astype(np.int16, copy=False)
        x = pcm.astype(np.float64)
        if self._taps > 1:  # a box filter as wide as the decimation: keeps aliasing down
            joined = np.concatenate([self._tail, x])
            self._tail = joined[len(joined) - (self._taps - 1):]
            x = np.convolve(joined, np.full(self._taps, 1.0 / self._taps), mode="valid")
        if x.size == 0:
            return np.zeros(0, dtype=np.int16)
        buf, offset = (np.concatenate([[self._prev], x]), 1) if self._prev is not None else (x, 0)
        last = x.size - 1
        n = int(np.floor((last - self._pos) / self.step)) + 1 if last >= self._pos else 0
        at = self._pos + np.arange(n) * self.step + offset
        out = np.interp(at, np.arange(buf.size), buf)
        self._pos += n * self.step - x.size
        self._prev = float(x[-1])
        clipped: np.ndarray = np.clip(np.round(out), -32768, 32767).astype(np.int16)
        return clipped
