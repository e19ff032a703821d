"""`wan_causal`'s configuration: the architecture (`Arch`, one per published model, or a tiny one for
tests), the weights source, and the step schedule warped by the timestep shift.

The published architectures, as read from upstream (Wan 2.1 1.3B, `Wan-AI/Wan2.1-T2V-1.3B`
config; Self-Forcing `configs/self_forcing_dmd.yaml`; LongLive `configs/longlive_inference.yaml`;
Matrix-Game-2 `configs/distilled_model/universal/config.json` and `inference_universal.yaml`):

| | Self-Forcing | LongLive | Matrix-Game-2 |
|---|---|---|---|
| task | text to video 480×832 | text to video 480×832, rolling | image to video 352×640, keyboard + mouse |
| latent / tokens per frame | 60×104 / 1560 | 60×104 / 1560 | 44×80 / 880 |
| KV window (frames) | 21, no sink | 3 sink + 9 rolling | 6, no sink |
| input channels | 16 | 16 | 36 (16 noise + 4 mask + 16 image latent) |
| cross-attention | UMT5 text, 512 tokens | UMT5 text, 512 tokens | CLIP image, 257 tokens |
| steps | 1000, 750, 500, 250 | 1000, 750, 500, 250 | 1000, 666, 333 |

All: 30 blocks of width 1536 (12 heads of 128), FFN 8960 (GELU tanh), q/k RMSNorm across heads,
3-axis RoPE, adaLN with a per-frame timestep, 3 latent frames per block, timestep shift 5, the Wan
2.1 VAE (z 16, base 96, ×4 time and ×8 space).
"""

from __future__ import annotations

from typing import Literal

import msgspec

from services.engine_host.backends.flow_schedule import schedule, shifted_sigma

__all__ = ["KEYS", "PRESETS", "Arch", "WanCausalConfig", "schedule", "shifted_sigma"]

KEYS = ("w", "s", "a", "d")  # Matrix-Game-2 universal's keyboard: forward, back, left, right


class Arch(msgspec.Struct, frozen=True, kw_only=True):
    """The model's shape. `dim` = heads × head_dim; an action module sits in `action_blocks`."""

    layers: int = 2
    heads: int = 2
    head_dim: int = 24  # ≥ 6 and even: RoPE splits it over (frame, height, width)
    ffn_dim: int = 96
    in_channels: int = 4
    out_channels: int = 4
    text_dim: int = 32  # the text encoder's width (UMT5-XXL: 4096); 0: no text (Matrix-Game-2)
    image_dim: int = 0  # the image encoder's width (CLIP ViT-H: 1280); 0: no image cross-attention
    context_tokens: int = 8  # cross-attention tokens (text: 512, padded with zeros, as upstream)
    freq_dim: int = 32
    latent_h: int = 4
    latent_w: int = 6
    frames_per_block: int = 3
    sink_frames: int = 0
    window_frames: int = 6
    # Matrix-Game-2's action module (its ActionModule): blocks it sits in, and its widths
    action_blocks: tuple[int, ...] = ()
    keyboard_dim: int = len(KEYS)
    mouse_dim: int = 2
    action_hidden: int = 16  # keyboard embedding width (128)
    action_dim: int = 16  # mouse / keyboard attention width (1024)
    action_heads: int = 2  # (16)
    action_rope_dims: int = 4  # head dims rotated by the frame index (8 of 64; theta 256)
    action_window: int = 3  # latent frames of past actions each frame sees (`windows_size`)
    # the Wan VAE
    vae_base_dim: int = 8
    vae_dim_mult: tuple[int, ...] = (1, 2, 4, 4)
    vae_res_blocks: int = 2
    step_list: tuple[int, ...] = (1000, 750, 500, 250)
    timestep_shift: float = 5.0
    fps: float = 16.0

    @property
    def dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def tokens(self) -> int:
        return (self.latent_h // 2) * (self.latent_w // 2)

    @property
    def slots(self) -> int:
        return self.sink_frames + self.window_frames

    @property
    def image_cond_channels(self) -> int:
        """Channels concatenated to the noise (Matrix-Game-2: 4 mask + 16 image latent)."""
        return self.in_channels - self.out_channels

    @property
    def action_frames(self) -> int:
        """Video frames of past actions one latent frame's action window covers (4 × windows_size)."""
        return 4 * self.action_window


def _wan13b(**kw) -> Arch:
    base = dict(layers=30, heads=12, head_dim=128, ffn_dim=8960, in_channels=16, out_channels=16, text_dim=4096,
                context_tokens=512, freq_dim=256, vae_base_dim=96)
    return Arch(**(base | kw))


PRESETS: dict[str, Arch] = {
    "tiny": Arch(),
    "tiny_i2v_actions": Arch(in_channels=12, text_dim=0, image_dim=12, context_tokens=5, action_blocks=(0,),
                             step_list=(1000, 666, 333), fps=25.0),
    "self_forcing": _wan13b(latent_h=60, latent_w=104, sink_frames=0, window_frames=21),
    "longlive": _wan13b(latent_h=60, latent_w=104, sink_frames=3, window_frames=9),
    "matrix_game_2": _wan13b(in_channels=36, text_dim=0, image_dim=1280, context_tokens=257, latent_h=44,
                             latent_w=80, window_frames=6, action_blocks=tuple(range(15)), action_hidden=128,
                             action_dim=1024, action_heads=16, action_rope_dims=8, step_list=(1000, 666, 333),
                             fps=25.0),
}


class WanCausalConfig(msgspec.Struct, frozen=True, kw_only=True):
    """What a host config names (`backend_configs.wan_causal`). Exactly one weights source:
    `weights_dir` (a local directory, see `docs/backends.md`) or `random_weights = true` (random
    weights from a fixed seed: benchmarks and tests only). With neither the backend refuses to start."""

    preset: Literal["tiny", "tiny_i2v_actions", "self_forcing", "longlive", "matrix_game_2"] = "tiny"
    arch: Arch | None = None  # overrides the preset's architecture whole (tests)
    weights_dir: str = ""
    weights_layout: Literal["diffusers", "wan"] = "diffusers"
    # sha256 of every file read from weights_dir, by its path relative to it
    weights_sha256: dict[str, str] = {}
    random_weights: bool = False
    # prompt (and init image) embeddings: "file" reads precomputed ones from embeddings_path (a safetensors
    # file, keyed by the sha256 of the prompt's UTF-8 or of the image's RGB bytes); "umt5" runs a local
    # UMT5 encoder (transformers, embedder_dir, never a download); "random" is named for what it is.
    embedder: Literal["file", "umt5", "random"] = "file"
    embeddings_path: str = ""
    embeddings_sha256: str = ""
    embedder_dir: str = ""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"  # weights, activations and caches
    vae_cache_role: Literal["rebuildable", "moved"] = "rebuildable"

    @property
    def a(self) -> Arch:
        return self.arch if self.arch is not None else PRESETS[self.preset]
