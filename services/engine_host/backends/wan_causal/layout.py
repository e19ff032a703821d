"""The per-session state of a config, computed without weights or state (the meta-device probe of
the VAE decoder is the only model code it runs): every leaf, its bytes and its role.

- `layers/<i>/k`, `v`: self-attention, `[sink + window, tokens, dim]`, the ring (moved);
- `layers/<i>/cross_k`, `cross_v`: `[context tokens, dim]`, the prompt's or image's (static);
- `layers/<i>/mouse_k`, `mouse_v`, `kbd_k`, `kbd_v` in the action blocks only (moved);
- `actions`: the last `4·windows_size` video frames' keys and mouse deltas (moved, Matrix-Game-2);
- `image_cond`: the init image's latent and mask, `[4 + 16, h, w]` (static, Matrix-Game-2);
- `latents`: the last `history_frames` latent frames, a ring (moved: what a rebuild replays);
- `vae/<i>`: the decoder's feature cache (rebuildable by default);
- `seed`, `block`.
"""

from __future__ import annotations

import functools

import torch

from services.engine_host.backends.spec import TensorSpec
from services.engine_host.backends.wan_causal import vae as vae_mod
from services.engine_host.backends.wan_causal.config import Arch, WanCausalConfig


@functools.lru_cache(maxsize=16)
def _vae_shapes(a: Arch) -> tuple[tuple[int, ...], ...]:
    return tuple(vae_mod.cache_shapes(a))


def state_spec(c: WanCausalConfig) -> dict:
    a, dt = c.a, getattr(torch, c.dtype)
    S, T, D = a.slots, a.tokens, a.dim
    layers = []
    for i in range(a.layers):
        layer = {"k": TensorSpec(dt, (S, T, D)), "v": TensorSpec(dt, (S, T, D)),
                 "cross_k": TensorSpec(dt, (a.context_tokens, D), "static"),
                 "cross_v": TensorSpec(dt, (a.context_tokens, D), "static")}
        if i in a.action_blocks:
            layer |= {"mouse_k": TensorSpec(dt, (S, T, a.action_dim)), "mouse_v": TensorSpec(dt, (S, T, a.action_dim)),
                      "kbd_k": TensorSpec(dt, (S, a.action_dim)), "kbd_v": TensorSpec(dt, (S, a.action_dim))}
        layers.append(layer)
    spec: dict = {"layers": layers}
    if a.action_blocks:
        spec["actions"] = TensorSpec(torch.float32, (a.action_frames, a.keyboard_dim + a.mouse_dim))
    if a.image_cond_channels:
        spec["image_cond"] = TensorSpec(torch.float32, (a.image_cond_channels, a.latent_h, a.latent_w), "static")
    spec["latents"] = TensorSpec(torch.float32, (vae_mod.history_frames(a), a.out_channels, a.latent_h, a.latent_w))
    spec["vae"] = [TensorSpec(dt, s, c.vae_cache_role) for s in _vae_shapes(a)]
    spec["seed"] = int
    spec["block"] = int
    return spec


def check_arch(a: Arch) -> str:
    """What is wrong with an architecture ('' when nothing)."""
    if a.head_dim < 6 or a.head_dim % 2 or a.latent_h % 2 or a.latent_w % 2:
        return "head_dim must be even and ≥ 6, latent height and width even"
    if a.window_frames < a.frames_per_block or a.frames_per_block < 1 or not a.step_list:
        return "window_frames ≥ frames_per_block ≥ 1 and a step list"
    if not a.text_dim and not a.image_dim:
        return "a text_dim or an image_dim (the cross-attention context)"
    if a.action_blocks and (a.action_dim % a.action_heads or max(a.action_blocks) >= a.layers
                            or a.action_rope_dims > a.action_dim // a.action_heads or a.action_rope_dims % 2):
        return "action_dim / action_heads, action_blocks within the layers, even action_rope_dims ≤ head dim"
    if a.in_channels not in (a.out_channels, a.out_channels + 4 + a.out_channels):
        return "in_channels is out_channels, or out_channels + 4 mask + out_channels image latent (image to video)"
    return ""
