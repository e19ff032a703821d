"""`avatar`: a text-driven talking-avatar pipeline, text → encode → denoise → decode.

encode turns the chunk's text into conditioning tokens coloured by the session's
speaker embedding (which drifts with what was said); denoise refines motion and
audio latents for one chunk of frames attending to the conditioning and to the
prosody cache of earlier chunks, then writes its own summary into that cache;
decode renders video frames and an audio waveform whose oscillator phase
carries across chunks so the audio has no seam. A frame is a face drawn over a
texture the model paints on a coarse grid (upsampled to the frame size): the
face's tint follows the chunk's motion latent and its mouth opens with each
frame's loudness, so what a viewer sees moves with what they hear.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import crc32c
import msgspec
import torch
import torch.nn.functional as F

from libs.schemas.common import InputItem
from libs.schemas.engine import SessionInit
from services.engine_host.backends.base import WEIGHT_SEED, Output, block_generator, weights
from services.engine_host.backends.inputs import parse_text


class AvatarConfig(msgspec.Struct, frozen=True, kw_only=True):
    d_model: int = 64
    cond_tokens: int = 16
    prosody_len: int = 16
    frames: int = 10  # video frames per chunk
    fps: float = 25.0
    image: int = 256  # square frames, image×image
    grid: int = 16  # the model paints grid×grid texels, upsampled to image×image
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
        self.max_input_bytes = c.text_max_bytes  # declared in the profile, so ingress refuses longer text
        g = torch.Generator().manual_seed(WEIGHT_SEED + 1)
        D, dev = c.d_model, self.device
        self.byte_emb = weights((256, D), g, dev, scale=1.0)
        self.cond_q = weights((c.cond_tokens, D), g, dev, scale=1.0)
        self.w = {name: weights(shape, g, dev) for name, shape in
                  (("q", (D, D)), ("k", (D, D)), ("v", (D, D)), ("w1", (D, 2 * D)), ("w2", (2 * D, D)),
                   ("video", (D, 3 * c.grid * c.grid)), ("audio", (D, 2)), ("tint", (D, 3)))}
        self.face = _FaceGeometry(c.image, dev)

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
        return parse_text(item, self.config.text_max_bytes)

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
        ctrl = (carry @ self.w["audio"]).double().cpu()  # [F, 2]: loudness, pitch
        amp = torch.sigmoid(ctrl[:, 0]) * 0.5
        frames = self._render(carry, amp.float().to(self.device))
        freq = 120.0 + 80.0 * torch.tanh(ctrl[:, 1])
        spf = round(c.sample_rate / c.fps)
        step = (2 * math.pi * freq / c.sample_rate).repeat_interleave(spf)
        phase = state["phase"] + torch.cumsum(step, 0)
        audio = (amp.repeat_interleave(spf) * torch.sin(phase) * 32767).round().to(torch.int16)
        state["phase"] = float(phase[-1].item() % (2 * math.pi))
        return Output(frames=frames.cpu(), audio=audio)

    def _render(self, carry: torch.Tensor, amp: torch.Tensor) -> torch.Tensor:
        """uint8 [F, 3, image, image]: a face over the chunk's painted texture, the mouth drawn per frame.
        Everything but the mouth is the same for the chunk's frames, so it is drawn once (real time on a
        small CPU at 256×256) and only the mouth's box is drawn per frame."""
        c, geo = self.config, self.face
        pooled = carry.mean(0)
        texels = torch.sigmoid(3.0 * (pooled @ self.w["video"])).reshape(1, 3, c.grid, c.grid)  # the mean is calm: lift it
        texture = F.interpolate(texels, size=(c.image, c.image), mode="bilinear", align_corners=False)
        skin = torch.tensor([0.98, 0.8, 0.64], device=carry.device)
        tint = (skin * (0.7 + 0.6 * torch.sigmoid(pooled @ self.w["tint"]))).view(1, 3, 1, 1)
        face = torch.lerp(0.25 + 0.5 * texture, tint * geo.shade + 0.12 * texture, geo.face) * (1 - geo.eyes)
        frames = _to_uint8(face).expand(c.frames, -1, -1, -1).clone()
        ys, xs = geo.mouth_box
        lips = torch.tensor([0.45, 0.05, 0.08], device=carry.device).view(1, 3, 1, 1)
        frames[:, :, ys, xs] = _to_uint8(torch.lerp(face[:, :, ys, xs], lips, geo.mouth(amp)))
        return frames


def _to_uint8(img: torch.Tensor) -> torch.Tensor:
    return (img.clamp(0, 1) * 255).round().to(torch.uint8)


class _FaceGeometry:
    """Soft masks of a face over an S×S frame, precomputed once (coordinates in [0, 1])."""

    def __init__(self, size: int, device: torch.device) -> None:
        self.size = size
        axis = (torch.arange(size, dtype=torch.float32, device=device) + 0.5) / size
        self.y, self.x = axis.view(-1, 1), axis.view(1, -1)
        self.face = self._disc(0.5, 0.52, 0.36, 0.36)
        self.shade = 1.0 - 0.35 * ((self.x - 0.42) ** 2 + (self.y - 0.4) ** 2).sqrt()  # light from top left
        self.eyes = torch.maximum(self._disc(0.37, 0.42, 0.045, 0.055), self._disc(0.63, 0.42, 0.045, 0.055))
        # the widest mouth (amp 0.5) spans x 0.5 ± 0.13, y 0.7 ± 0.092: its box, a little larger
        self.mouth_box = (slice(int(0.59 * size), int(0.81 * size) + 1), slice(int(0.35 * size), int(0.65 * size) + 1))

    def _disc(self, cx: float, cy: float, rx: float, ry: float) -> torch.Tensor:
        """1 inside the ellipse, 0 outside, with a soft edge about a pixel and a half wide."""
        d = (((self.x - cx) / rx) ** 2 + ((self.y - cy) / ry) ** 2).sqrt()
        return ((1 - d) * self.size * min(rx, ry) / 1.5).clamp(0, 1)

    def mouth(self, amp: torch.Tensor) -> torch.Tensor:
        """[F, 1, h, w] over `mouth_box`: one mouth per frame, open in proportion to its loudness `amp` in [0, 0.5]."""
        ys, xs = self.mouth_box
        ry = (0.012 + 0.16 * amp).view(-1, 1, 1, 1)
        d = (((self.x[:, xs] - 0.5) / 0.13) ** 2 + ((self.y[ys] - 0.7) / ry) ** 2).sqrt()
        return ((1 - d) * self.size * 0.012).clamp(0, 1)
