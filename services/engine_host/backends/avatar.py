"""`avatar`: a text-driven talking-avatar pipeline, text → encode → denoise → decode.

encode turns the chunk's text into conditioning tokens coloured by the session's
speaker embedding (which drifts with what was said); denoise refines motion and
audio latents for one chunk of frames attending to the conditioning and to the
prosody cache of earlier chunks, then writes its own summary into that cache;
decode renders video frames and an audio waveform whose oscillator phase
carries across chunks so the audio has no seam.
"""

from __future__ import annotations

import json
import math
from typing import Any, ClassVar

import crc32c
import msgspec
import torch
import torch.nn.functional as F

from libs.errors import BadRequest, TooLarge
from libs.schemas.common import InputItem
from libs.schemas.engine import SessionInit
from services.engine_host.backends.base import WEIGHT_SEED, Output, block_generator, weights


class AvatarConfig(msgspec.Struct, frozen=True, kw_only=True):
    d_model: int = 64
    cond_tokens: int = 16
    prosody_len: int = 16
    frames: int = 10  # video frames per chunk
    fps: float = 25.0
    image: int = 32  # square frames, image×image
    sample_rate: int = 16000
    text_max_bytes: int = 256  # per chunk, all the text released to it together
    tiers: tuple[int, ...] = (1, 2, 4, 8)


class AvatarBackend:
    name: ClassVar[str] = "avatar"
    config_type: ClassVar[type] = AvatarConfig
    input_kinds = frozenset({"text"})
    batchable = True

    def __init__(self, config: AvatarConfig | None = None, device: torch.device | str = "cpu") -> None:
        c = self.config = config or AvatarConfig()
        self.device = torch.device(device)
        self.tiers = tuple(sorted(c.tiers))
        self.media_s_per_block = c.frames / c.fps
        g = torch.Generator().manual_seed(WEIGHT_SEED + 1)
        D, dev, half = c.d_model, self.device, c.image // 2
        self.byte_emb = weights((256, D), g, dev, scale=1.0)
        self.cond_q = weights((c.cond_tokens, D), g, dev, scale=1.0)
        self.w = {name: weights(shape, g, dev) for name, shape in
                  (("q", (D, D)), ("k", (D, D)), ("v", (D, D)), ("w1", (D, 2 * D)), ("w2", (2 * D, D)),
                   ("video", (D, 3 * half * half)), ("audio", (D, 2)))}

    def config_bytes(self) -> bytes:
        return msgspec.msgpack.encode(self.config)

    def init_state(self, seed: int, init: SessionInit) -> dict:
        c = self.config
        g = block_generator(seed, -1, crc32c.crc32c(init.prompt.encode()))
        return {
            "speaker": torch.randn(c.d_model, generator=g).to(self.device),
            "prosody": torch.zeros((c.prosody_len, c.d_model), device=self.device),
            "seed": seed,
            "block": 0,
            "phase": 0.0,
        }

    def state_spec(self) -> dict:
        """The state tree's layout: tensor leaves as (dtype, shape), scalars as their type."""
        c = self.config
        return {"speaker": (torch.float32, (c.d_model,)), "prosody": (torch.float32, (c.prosody_len, c.d_model)),
                "seed": int, "block": int, "phase": float}

    def parse_input(self, item: InputItem) -> bytes:
        if item.kind != "text":
            raise BadRequest(f"avatar takes text inputs, not {item.kind}", session_id=item.session_id, seq=item.seq)
        try:
            value = json.loads(item.data)
        except ValueError:
            raise BadRequest("text data is not JSON", session_id=item.session_id, seq=item.seq) from None
        if not isinstance(value, str):
            raise BadRequest("text data must be a JSON string", session_id=item.session_id, seq=item.seq)
        raw = value.encode()
        if len(raw) > self.config.text_max_bytes:
            raise TooLarge(f"text of {len(raw)} bytes exceeds {self.config.text_max_bytes} per item",
                           session_id=item.session_id, seq=item.seq, size=len(raw))
        return raw

    def encode(self, state: dict, inputs: list[Any]) -> torch.Tensor:
        """Owns `speaker`. Text beyond the per-chunk budget is cut (the chunk speaks what fits)."""
        text = b" ".join(inputs)[: self.config.text_max_bytes]
        speaker = state["speaker"]
        if not text:
            return speaker.expand(self.config.cond_tokens, -1).clone()
        ids = torch.tensor(list(text), dtype=torch.int64, device=self.device)
        emb = self.byte_emb[ids]  # [n, D]
        cond = torch.softmax(self.cond_q @ emb.T / math.sqrt(emb.shape[1]), dim=-1) @ emb + speaker
        speaker.mul_(0.95).add_(0.05 * cond.mean(0))  # the voice drifts with what was said
        return cond

    def denoise(self, state: dict, carry: torch.Tensor, steps: int) -> torch.Tensor:
        return self.denoise_batch([state], [carry], steps)[0]

    def denoise_batch(self, states: list[dict], carries: list[torch.Tensor], steps: int) -> list[torch.Tensor]:
        """Owns `prosody` and `block`."""
        c, w = self.config, self.w
        x = torch.stack([torch.randn((c.frames, c.d_model), generator=block_generator(s["seed"], s["block"]))
                         for s in states]).to(self.device)
        ctx = torch.stack([torch.cat([cond, s["prosody"]]) for s, cond in zip(states, carries, strict=True)])  # [B, C+P, D]
        keys, vals = ctx @ w["k"], ctx @ w["v"]
        for _ in range(steps):
            att = torch.softmax((x @ w["q"]) @ keys.transpose(1, 2) / math.sqrt(c.d_model), dim=-1) @ vals
            target = torch.tanh(F.layer_norm(x + att, (c.d_model,)) @ w["w1"]) @ w["w2"]
            x = x - (x - target) / steps
        for b, s in enumerate(states):
            s["prosody"][s["block"] % c.prosody_len].copy_(x[b].mean(0))
            s["block"] += 1
        return list(x.unbind(0))

    def decode(self, state: dict, carry: torch.Tensor) -> Output:
        """Owns `phase`."""
        c = self.config
        half = c.image // 2
        img = torch.sigmoid(carry @ self.w["video"]).reshape(c.frames, 3, half, half)
        frames = (img.repeat_interleave(2, 2).repeat_interleave(2, 3) * 255).round().to(torch.uint8)
        ctrl = (carry @ self.w["audio"]).double().cpu()  # [F, 2]: loudness, pitch
        amp = torch.sigmoid(ctrl[:, 0]) * 0.5
        freq = 120.0 + 80.0 * torch.tanh(ctrl[:, 1])
        spf = round(c.sample_rate / c.fps)
        step = (2 * math.pi * freq / c.sample_rate).repeat_interleave(spf)
        phase = state["phase"] + torch.cumsum(step, 0)
        audio = (amp.repeat_interleave(spf) * torch.sin(phase) * 32767).round().to(torch.int16)
        state["phase"] = float(phase[-1].item() % (2 * math.pi))
        return Output(frames=frames.cpu(), audio=audio)
