"""`avatar`: a text-driven talking-avatar pipeline, text → encode → denoise → decode.

encode turns the chunk's text into conditioning tokens coloured by the session's
speaker embedding (which drifts with what was said); denoise refines motion and
audio latents for one chunk of frames attending to the conditioning and to the
prosody cache of earlier chunks, then writes its own summary into that cache;
decode renders video frames and an audio waveform whose oscillator phase
carries across chunks so the audio has no seam (or, with `voice = "espeak"`, speaks the text with
Debian's espeak-ng: speech.py; the chunk plays the next block of that speech and the mouth follows
its loudness, so the path text → speech → face → video is real). A frame is a face drawn over a
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

from libs.errors import ConfigError
from libs.schemas.common import InputItem
from libs.schemas.engine import SessionInit
from services.engine_host.backends.base import WEIGHT_SEED, Output, block_generator, weights
from services.engine_host.backends.face_geometry import FaceGeometry, to_uint8
from services.engine_host.backends.inputs import parse_text
from services.engine_host.backends.talking_head import ring
from services.engine_host.backends.talking_head.face import frame_features


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
    voice: str = "tone"  # "tone": the model's own oscillator; "espeak": speech from espeak-ng
    speech_s: float = 30.0  # espeak: the most speech a session holds not yet played


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
        self.face = FaceGeometry(c.image, dev)
        if c.voice not in ("tone", "espeak"):
            raise ConfigError(f"avatar voice {c.voice!r} is not tone or espeak", voice=c.voice)
        self.speech = None
        if c.voice == "espeak":
            from services.engine_host.backends.speech import Espeak
            self.speech = Espeak()
        self.speech_samples = int(c.speech_s * c.sample_rate)

    def config_bytes(self) -> bytes:
        return msgspec.msgpack.encode(self.config)

    def init_state(self, seed: int, init: SessionInit) -> dict:
        c = self.config
        g = block_generator(seed, -1, crc32c.crc32c(init.prompt.encode()))
        state = {
            "speaker": torch.randn(c.d_model, generator=g).to(self.device),
            "prosody": torch.zeros((c.prosody_len, c.d_model), device=self.device),
            "seed": seed,
            "block": 0,
            "phase": 0.0,
        }
        if self.speech is not None:  # the speech not yet played, as the talking head's audio ring
            state["speech"] = {"ring": torch.zeros(self.speech_samples, dtype=torch.int16, device=self.device),
                               "head": 0, "tail": 0, "played": 0, "overflow": 0}
        return state

    def state_spec(self) -> dict:
        """The state tree's layout: tensor leaves as (dtype, shape), scalars as their type."""
        c = self.config
        spec = {"speaker": (torch.float32, (c.d_model,)), "prosody": (torch.float32, (c.prosody_len, c.d_model)),
                "seed": int, "block": int, "phase": float}
        if self.speech is not None:
            spec["speech"] = {"ring": (torch.int16, (self.speech_samples,)), "head": int, "tail": int,
                              "played": int, "overflow": int}
        return spec

    def parse_input(self, item: InputItem) -> bytes:
        return parse_text(item, self.config.text_max_bytes)

    def encode(self, state: dict, inputs: list[Any]) -> torch.Tensor:
        """Owns `speaker` (and `speech`). Text beyond the per-chunk budget is cut (the chunk speaks what fits)."""
        text = b" ".join(inputs)[: self.config.text_max_bytes]
        if self.speech is not None and text:
            ring.push(state["speech"], self.speech.speak(text.decode(errors="replace")).to(self.device))
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
        if self.speech is not None:
            return self._speak(state, carry)
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

    def _speak(self, state: dict, carry: torch.Tensor) -> Output:
        """The chunk's share of the speech (silence once it is all played), the mouth opening with each
        frame's loudness."""
        c = self.config
        n = round(c.sample_rate / c.fps) * c.frames
        audio = torch.zeros(n, dtype=torch.int16)
        said = ring.take(state["speech"], n).cpu()
        audio[: said.shape[0]] = said
        amp = 0.5 * frame_features(audio.float() / 32768.0, c.frames)[:, 0]
        return Output(frames=self._render(carry, amp.to(self.device)).cpu(), audio=audio)

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
        frames = to_uint8(face).expand(c.frames, -1, -1, -1).clone()
        ys, xs = geo.mouth_box
        lips = torch.tensor([0.45, 0.05, 0.08], device=carry.device).view(1, 3, 1, 1)
        frames[:, :, ys, xs] = to_uint8(torch.lerp(face[:, :, ys, xs], lips, geo.mouth(amp)))
        return frames
