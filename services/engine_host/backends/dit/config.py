"""The causal DiT's configuration: sizes, the trained step list and its timestep shift, dtypes and
cache roles."""

from __future__ import annotations

from typing import Literal

import msgspec

KEYS = ("w", "a", "s", "d", "space", "shift")
CONV_T = 3  # temporal kernel of the decoder's causal convolutions; each caches CONV_T - 1 input frames


class DitConfig(msgspec.Struct, frozen=True, kw_only=True):
    layers: int = 2
    dim: int = 32
    heads: int = 2
    latent_channels: int = 4
    latent_h: int = 4
    latent_w: int = 6
    patch: int = 2
    frames_per_block: int = 3
    sink_frames: int = 0
    window_frames: int = 6
    ffn_dim: int = 128  # the MLP's hidden width (Wan 2.1 1.3B: 8960)
    # The keyboard and mouse module sits in the first `action_layers` layers only (Matrix-Game-2:
    # blocks 0-14 of 30), after cross-attention; the other layers have no action caches.
    action_layers: int = 1
    action_window: int = 3  # latent frames of past actions each frame reads (Matrix-Game-2 `windows_size`)
    mouse_dim: int = 16
    mouse_heads: int = 1
    keyboard_dim: int = 16
    # Channels concatenated to the noise: 0, or 4 mask + `latent_channels` of the init image
    # (Matrix-Game-2: 16 noise + 20 = 36 input channels)
    cond_channels: int = 8
    context_tokens: int = 8  # cross-attention tokens from the init image or prompt
    step_list: tuple[int, ...] = (1000, 750, 500, 250)  # the trained few-step schedule
    timestep_shift: float = 5.0  # σ of trained step t is shift·s / (1 + (shift − 1)·s), s = t / 1000
    vae_channels: tuple[int, ...] = (16, 8)  # decoder levels; each after the first doubles H and W
    vae_convs: tuple[int, ...] = (2, 2)  # causal convolutions per level, in residual pairs
    temporal_up: int = 4  # RGB frames per latent frame (the first latent frame of a session gives 1)
    fps: float = 25.0
    kv_dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    vae_cache_role: Literal["rebuildable", "moved"] = "rebuildable"
    weights_path: str = ""  # a local safetensors file; empty: random weights from a fixed seed
    weights_sha256: str = ""

    @property
    def tokens(self) -> int:
        return (self.latent_h // self.patch) * (self.latent_w // self.patch)

    @property
    def slots(self) -> int:
        return self.sink_frames + self.window_frames

    @property
    def action_frames(self) -> int:
        """Video frames of past actions one latent frame's window covers (Matrix-Game-2: 4 × 3)."""
        return self.temporal_up * self.action_window

    @property
    def causal_convs(self) -> int:
        return 1 + sum(self.vae_convs) + 1  # conv_in, the levels, the head

    @property
    def history_frames(self) -> int:
        """Latent frames the decoder's feature cache depends on: its receptive field, in whole blocks."""
        need = (CONV_T - 1) * self.causal_convs
        return -(-need // self.frames_per_block) * self.frames_per_block

    @staticmethod
    def matrix_game_2() -> DitConfig:
        """Matrix-Game-2's published shape (its `configs/distilled_model/universal/config.json` and
        `inference_universal.yaml`): 352×640 at 25 fps (latent 16×44×80, 2×2 patches: 880 tokens per
        frame), 36 input channels (16 noise + 4 mask + 16 image latent), 30 layers of width 1536 with
        an FFN of 8960, a 6-frame local window in bf16, the mouse and keyboard module of width 1024
        in blocks 0-14 with a 3-latent-frame action window, 257 image tokens, steps [1000, 666, 333]
        at shift 5, and a Wan-style decoder (384/384/192/96 channels doubling to 352×640)."""
        return DitConfig(layers=30, dim=1536, heads=12, latent_channels=16, latent_h=44, latent_w=80, patch=2,
                         frames_per_block=3, sink_frames=0, window_frames=6, ffn_dim=8960, action_layers=15,
                         action_window=3, mouse_dim=1024, mouse_heads=16, keyboard_dim=1024, cond_channels=20,
                         context_tokens=257, step_list=(1000, 666, 333), vae_channels=(384, 384, 192, 96),
                         vae_convs=(10, 6, 6, 6), kv_dtype="bfloat16")
