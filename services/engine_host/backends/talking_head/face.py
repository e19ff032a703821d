"""The face half of the talking head: per-frame audio features → motion → frames.

`AudioFace` is where a real audio-to-video model drops in (a LiveTalk/OmniAvatar-style port): its
`features` is the audio encoder (wav2vec-like, per video frame), `motion_batch` the denoiser that
turns features and its own recurrent state into per-frame motion latents (writing that state last,
in place), `render` the decoder to uint8 frames. The backend around it (backend.py) owns
everything a voice agent needs and no model should re-implement: the pending-audio ring, the
control items, the events, and the exact audio each block consumed.

`EnergyFace` is the built-in model, small enough for CPU tests: a frame's loudness opens the mouth
(so what a viewer sees moves with what they hear, frame by frame), its brightness (zero-crossing
rate) rounds or widens it, and a recurrent motion latent sways the head and tints the skin.
"""

from __future__ import annotations

import math
from typing import Protocol

import crc32c
import torch
import torch.nn.functional as F

from libs.schemas.engine import SessionInit
from services.engine_host.backends.base import WEIGHT_SEED, block_generator, weights
from services.engine_host.backends.face_geometry import FaceGeometry, to_uint8
from services.engine_host.backends.spec import TensorSpec

N_FEATURES = 3  # loudness (dB above the floor, scaled), zero-crossing rate, low-band share
SILENCE_DB = -60.0


class AudioFace(Protocol):
    def state_spec(self) -> dict: ...

    def init_state(self, seed: int, init: SessionInit) -> dict: ...

    def features(self, audio: torch.Tensor, frames: int) -> torch.Tensor:
        """float32 [frames, k] from one block's audio (float32 [frames · samples_per_frame], zero past
        what the block consumed): frame f's features come from its own samples only."""
        ...

    def motion_batch(self, states: list[dict], feats: list[torch.Tensor], steps: int) -> list[torch.Tensor]: ...

    def render(self, state: dict, motion: torch.Tensor, feats: torch.Tensor) -> torch.Tensor:
        """uint8 [frames, 3, H, W]."""
        ...


def frame_features(audio: torch.Tensor, frames: int) -> torch.Tensor:
    """[frames, N_FEATURES]: per frame window, loudness in [0, 1] (0 = silence), zero-crossing rate in
    [0, 1], and the share of energy below ~1 kHz (a crude open/rounded vowel cue)."""
    win = audio.reshape(frames, -1).double()
    rms = win.pow(2).mean(1).sqrt()
    db = 20 * torch.log10(rms.clamp_min(1e-9))
    loud = ((db - SILENCE_DB) / -SILENCE_DB).clamp(0, 1)
    signs = torch.signbit(win)
    zcr = (signs[:, 1:] != signs[:, :-1]).double().mean(1)
    smooth = F.avg_pool1d(win.unsqueeze(1), 16, 1, padding=8, count_include_pad=False).squeeze(1)[:, : win.shape[1]]
    low = smooth.pow(2).sum(1) / win.pow(2).sum(1).clamp_min(1e-12)
    return torch.stack([loud, zcr, low.clamp(0, 1)], dim=1).float()


class EnergyFace:
    def __init__(self, *, image: int, grid: int, d_motion: int, device: torch.device) -> None:
        self.image, self.grid, self.d = image, grid, d_motion
        self.device = device
        g = torch.Generator().manual_seed(WEIGHT_SEED + 3)
        self.w_in = weights((N_FEATURES, d_motion), g, device, scale=1.0)
        self.w_rec = weights((d_motion, d_motion), g, device, scale=0.5 / math.sqrt(d_motion))
        self.w_sway = weights((d_motion, 2), g, device, scale=0.5 / math.sqrt(d_motion))
        self.w_tint = weights((d_motion, 3), g, device)
        self.w_look = weights((16, 3 * grid * grid), g, device, scale=1.0)
        self.geo = FaceGeometry(image, device)

    def state_spec(self) -> dict:
        # the face's look is a pure function of the seed and prompt: regenerated, never sent
        return {"look": TensorSpec(torch.float32, (3, self.image, self.image), "static"),
                "motion": (torch.float32, (self.d,))}

    def init_state(self, seed: int, init: SessionInit) -> dict:
        g = block_generator(seed, -1, crc32c.crc32c(init.prompt.encode()))
        code = torch.randn(16, generator=g).to(self.device)
        texels = torch.sigmoid(code @ self.w_look).reshape(1, 3, self.grid, self.grid)
        texture = F.interpolate(texels, size=(self.image, self.image), mode="bilinear", align_corners=False)[0]
        skin = torch.tensor([0.98, 0.8, 0.64], device=self.device).view(3, 1, 1)
        geo = self.geo
        look = torch.lerp(0.25 + 0.5 * texture, skin * geo.shade + 0.12 * texture, geo.face) * (1 - geo.eyes)
        return {"look": look.contiguous(), "motion": torch.zeros(self.d, device=self.device)}

    def features(self, audio: torch.Tensor, frames: int) -> torch.Tensor:
        return frame_features(audio.to(self.device), frames)

    def motion_batch(self, states: list[dict], feats: list[torch.Tensor], steps: int) -> list[torch.Tensor]:
        """Per frame, the motion latent relaxes toward what that frame's features call for; `steps`
        refinement passes per frame (the quality tier). State is written after every result exists."""
        m = torch.stack([s["motion"] for s in states])  # [B, d]
        x = torch.stack(feats)  # [B, F, k]
        out = []
        for f in range(x.shape[1]):
            drive = x[:, f] @ self.w_in
            for _ in range(steps):
                m = m + (torch.tanh(drive + m @ self.w_rec) - m) * (0.5 / steps)
            out.append(m)
        motion = torch.stack(out, dim=1)  # [B, F, d]
        for b, s in enumerate(states):
            s["motion"].copy_(motion[b, -1])
        return list(motion.unbind(0))

    def render(self, state: dict, motion: torch.Tensor, feats: torch.Tensor) -> torch.Tensor:
        """The head (its tint and sway from the block's mean motion) is drawn once per block, the mouth
        once per frame: real time for several sessions on a small CPU."""
        geo, n = self.geo, motion.shape[0]
        pooled = motion.mean(0)
        tint = (0.85 + 0.3 * torch.sigmoid(pooled @ self.w_tint)).view(3, 1, 1)
        dy, dx = (torch.tanh(pooled @ self.w_sway) * 2).round().to(torch.int64).tolist()  # ±2 px of sway
        head = torch.roll(state["look"] * tint, shifts=(dy, dx), dims=(1, 2)).unsqueeze(0)
        out = to_uint8(head).expand(n, -1, -1, -1).clone()
        # The mouth follows the audio directly: loudness opens it, brightness narrows it a little.
        amp = 0.5 * feats[:, 0] * (1.0 - 0.3 * feats[:, 1])
        ys, xs = geo.mouth_box
        lips = torch.tensor([0.45, 0.05, 0.08], device=self.device).view(1, 3, 1, 1)
        out[:, :, ys, xs] = to_uint8(torch.lerp(head[:, :, ys, xs], lips, geo.mouth(amp)))
        return out


def mouth_opening(frames: torch.Tensor, geo_size: int) -> torch.Tensor:
    """How open each frame's mouth is, read back from the pixels ([F]: dark-red pixels in the mouth box):
    for tests and the benchmark, which check that the mouth moves with the audio."""
    geo = FaceGeometry(geo_size, frames.device)
    ys, xs = geo.mouth_box
    box = frames[:, :, ys, xs].float() / 255
    lip = (box[:, 0] > box[:, 1] + 0.2) & (box[:, 1] < 0.3)
    return lip.float().mean(dim=(1, 2))
