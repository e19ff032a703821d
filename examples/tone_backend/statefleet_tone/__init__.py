"""`tone`: a minimal talking-tone backend, registered through the `statefleet.backends` entry point.

State: `loudness` (a ring of the last blocks' loudness, moved), `voice` (a pitch embedding of the
init audio, role `static`: regenerated from the init inputs, never sent), and the scalars
`seed`, `block`, `phase`.
"""

from __future__ import annotations

import math
from typing import ClassVar

import msgspec
import torch

from libs.schemas.common import InputItem
from libs.schemas.engine import AUDIO_SAMPLE_RATE, SessionInit
from services.engine_host.backends.base import Output, block_generator
from services.engine_host.backends.inputs import parse_audio, pcm_samples
from services.engine_host.backends.spec import TensorSpec


class ToneConfig(msgspec.Struct, frozen=True, kw_only=True):
    block_s: float = 0.2
    frames: int = 4
    image: int = 16
    history: int = 8
    tiers: tuple[int, ...] = (1, 2)


class ToneBackend:
    name: ClassVar[str] = "tone"
    config_type: ClassVar[type] = ToneConfig
    input_kinds = frozenset({"audio"})
    init_kinds = frozenset({"audio"})  # the voice comes from an init clip
    batchable = False

    def __init__(self, config: ToneConfig, device: torch.device | str = "cpu") -> None:
        self.config = config
        self.device = torch.device(device)
        self.tiers = config.tiers
        self.media_s_per_block = config.block_s
        self.samples = round(config.block_s * AUDIO_SAMPLE_RATE)

    def config_bytes(self) -> bytes:
        return msgspec.msgpack.encode(self.config)

    def state_spec(self) -> dict:
        return {"loudness": TensorSpec(torch.float32, (self.config.history,)),
                "voice": TensorSpec(torch.float32, (2,), "static"), "seed": int, "block": int, "phase": float}

    def init_state(self, seed: int, init: SessionInit) -> dict:
        clip = pcm_samples(init.audio)
        zero_crossings = float((clip[1:] * clip[:-1] < 0).sum()) if clip.numel() > 1 else 0.0
        pitch = 110.0 + 0.5 * zero_crossings * AUDIO_SAMPLE_RATE / max(clip.numel(), 1) / 10
        return {"loudness": torch.zeros(self.config.history, device=self.device),
                "voice": torch.tensor([pitch, float(clip.abs().mean()) if clip.numel() else 0.0], device=self.device),
                "seed": seed, "block": 0, "phase": 0.0}

    def parse_input(self, item: InputItem) -> torch.Tensor:
        return parse_audio(item, max_samples=10 * self.samples)

    def encode(self, state: dict, inputs: list[torch.Tensor]) -> torch.Tensor:
        audio = torch.cat(inputs) if inputs else torch.zeros(0)
        return audio.pow(2).mean().sqrt() if audio.numel() else torch.tensor(0.0)

    def denoise(self, state: dict, carry: torch.Tensor, steps: int) -> torch.Tensor:
        return self.denoise_batch([state], [carry], steps)[0]

    def denoise_batch(self, states: list[dict], carries: list[torch.Tensor], steps: int) -> list[torch.Tensor]:
        out = []
        for s, loud in zip(states, carries, strict=True):
            g = block_generator(s["seed"], s["block"], device=self.device)
            level = loud.to(self.device)
            for _ in range(steps):  # a few smoothing steps toward the loudness history
                level = 0.5 * level + 0.5 * s["loudness"].mean() + 0.01 * torch.randn((), generator=g,
                                                                                          device=self.device)
            s["loudness"][s["block"] % self.config.history] = level
            s["block"] += 1
            out.append(level)
        return out

    def decode(self, state: dict, carry: torch.Tensor) -> Output:
        c = self.config
        bright = float(torch.sigmoid(carry * 8).item())
        frames = torch.full((c.frames, 3, c.image, c.image), round(bright * 255), dtype=torch.uint8)
        pitch = float(state["voice"][0])
        t = torch.arange(1, self.samples + 1, dtype=torch.float64)
        phase = state["phase"] + 2 * math.pi * pitch * t / AUDIO_SAMPLE_RATE
        state["phase"] = float(phase[-1] % (2 * math.pi))
        audio = (torch.sin(phase) * bright * 20000).round().to(torch.int16)
        return Output(frames=frames, audio=audio)
