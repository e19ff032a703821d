"""The transformer: one model pass over a block's frames through every layer (self-attention over
the ring, keyboard and mouse action modules, cross-attention to the init context, a modulated MLP),
writing each layer's caches at the block's ring slots in place."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from services.engine_host.backends.dit import ring
from services.engine_host.backends.dit.config import KEYS, DitConfig

Weights = dict[str, torch.Tensor]

LAYER_WEIGHTS = ("q", "k", "v", "o", "kbd_in", "kbd_q", "kbd_k", "kbd_v", "kbd_o", "mouse_q", "mouse_k", "mouse_v",
                 "mouse_in", "mouse_o", "cross_q", "cross_o", "mlp1", "mlp2")


def weight_shapes(c: DitConfig) -> dict[str, tuple[int, ...]]:
    D, Dm, Dk, P = c.dim, c.mouse_dim, c.keyboard_dim, c.latent_channels * c.patch * c.patch
    s: dict[str, tuple[int, ...]] = {
        "patch_in": (P, D), "pos": (c.tokens, D), "t1": (D, D), "t2": (D, 6 * D), "out": (D, P),
        "ctx_img": (3 * 4, D), "ctx_text": (256, D),
    }
    for i in range(c.layers):
        for n, shape in (("q", (D, D)), ("k", (D, D)), ("v", (D, D)), ("o", (D, D)),
                         ("kbd_in", (len(KEYS), Dk)), ("kbd_q", (D, Dk)), ("kbd_k", (Dk, Dk)),
                         ("kbd_v", (Dk, Dk)), ("kbd_o", (Dk, D)), ("mouse_q", (D, Dm)), ("mouse_k", (D, Dm)),
                         ("mouse_v", (D, Dm)), ("mouse_in", (2, Dm)), ("mouse_o", (Dm, D)),
                         ("cross_q", (D, D)), ("cross_k", (D, D)), ("cross_v", (D, D)), ("cross_o", (D, D)),
                         ("mlp1", (D, 4 * D)), ("mlp2", (4 * D, D))):
            s[f"layers.{i}.{n}"] = shape
    return s


def rms(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(dim, keepdim=True) + 1e-6)


def forward(c: DitConfig, w: Weights, state: dict, lat: torch.Tensor, sigma: float, action: torch.Tensor,
            kv_dtype: torch.dtype) -> torch.Tensor:
    """One model pass over the block's frames at noise level sigma; writes the caches' slots of
    these frames in place and attends over every filled slot. Returns the predicted velocity."""
    device = lat.device
    Fb, T, D, p = c.frames_per_block, c.tokens, c.dim, c.patch
    f0 = state["block"] * Fb
    slots, filled = ring.slots(c, f0, device)
    hp, wp = c.latent_h // p, c.latent_w // p
    tok = lat.reshape(Fb, c.latent_channels, hp, p, wp, p).permute(0, 2, 4, 1, 3, 5).reshape(Fb, T, -1)
    x = tok @ w["patch_in"] + w["pos"]  # [F, T, D]
    mod = (F.silu(_t_embed(c.dim, sigma, device) @ w["t1"]) @ w["t2"]).chunk(6)
    frames = torch.arange(f0, f0 + Fb, device=device, dtype=torch.float32)
    keys_held, mouse = action[: len(KEYS)], action[len(KEYS):]
    for i, cache in enumerate(state["layers"]):
        lw = {n: w[f"layers.{i}.{n}"] for n in LAYER_WEIGHTS}
        h = rms(x) * (1 + mod[0]) + mod[1]
        q, k = _rope(h @ lw["q"], frames, c.heads), _rope(h @ lw["k"], frames, c.heads)
        cache["k"].index_copy_(0, slots, k.to(kv_dtype))
        cache["v"].index_copy_(0, slots, (h @ lw["v"]).to(kv_dtype))
        x = x + mod[2] * (_attend(q, cache["k"][:filled], cache["v"][:filled], c.heads) @ lw["o"])
        # keyboard: one key/value per frame, attended by every token
        kb = keys_held @ lw["kbd_in"]
        cache["kbd_k"].index_copy_(0, slots, (kb @ lw["kbd_k"]).expand(Fb, -1).to(kv_dtype))
        cache["kbd_v"].index_copy_(0, slots, (kb @ lw["kbd_v"]).expand(Fb, -1).to(kv_dtype))
        hn = rms(x)
        kq = (hn @ lw["kbd_q"]).reshape(Fb * T, 1, -1)
        kbd = _attend(kq, cache["kbd_k"][:filled, None], cache["kbd_v"][:filled, None], 1)
        # mouse: each token attends its own history of (hidden state + mouse) over the window
        m = mouse @ lw["mouse_in"]
        cache["mouse_k"].index_copy_(0, slots, (hn @ lw["mouse_k"] + m).to(kv_dtype))
        cache["mouse_v"].index_copy_(0, slots, (hn @ lw["mouse_v"] + m).to(kv_dtype))
        ms = _temporal(hn @ lw["mouse_q"], cache["mouse_k"][:filled], cache["mouse_v"][:filled], c.mouse_heads)
        x = x + kbd.reshape(Fb, T, -1) @ lw["kbd_o"] + ms @ lw["mouse_o"]
        cq = (rms(x) @ lw["cross_q"]).reshape(1, Fb * T, D)
        cross = _attend(cq, cache["cross_k"][None], cache["cross_v"][None], c.heads)
        x = x + cross.reshape(Fb, T, D) @ lw["cross_o"]
        x = x + mod[5] * (F.gelu((rms(x) * (1 + mod[4]) + mod[3]) @ lw["mlp1"]) @ lw["mlp2"])
    out = rms(x) @ w["out"]  # [F, T, C·p·p]
    return out.reshape(Fb, hp, wp, c.latent_channels, p, p).permute(0, 3, 1, 4, 2, 5).reshape(lat.shape)


def _t_embed(dim: int, sigma: float, device: torch.device) -> torch.Tensor:
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32, device=device) / half)
    ang = sigma * 1000.0 * freqs
    return torch.cat([ang.sin(), ang.cos()])


def _rope(x: torch.Tensor, frames: torch.Tensor, heads: int) -> torch.Tensor:
    """Rotary position of each token's frame, per head (keys are cached already rotated)."""
    Fb, T, D = x.shape
    hd = D // heads
    freqs = torch.exp(-math.log(10000.0) * torch.arange(0, hd, 2, dtype=torch.float32, device=x.device) / hd)
    ang = frames[:, None] * freqs[None]  # [F, hd/2]
    cos, sin = ang.cos()[:, None, None], ang.sin()[:, None, None]
    xh = x.reshape(Fb, T, heads, hd // 2, 2)
    a, b = xh[..., 0], xh[..., 1]
    return torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).reshape(Fb, T, D)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int) -> torch.Tensor:
    """Queries [.., Tq, D] over keys/values [S, Tk, D] (all filled slots, every token)."""
    D = q.shape[-1]
    hd = D // heads
    qh = q.reshape(-1, heads, hd).transpose(0, 1)
    kh = k.float().reshape(-1, heads, hd).transpose(0, 1)
    vh = v.float().reshape(-1, heads, hd).transpose(0, 1)
    out = F.scaled_dot_product_attention(qh, kh, vh)
    return out.transpose(0, 1).reshape(q.shape)


def _temporal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int) -> torch.Tensor:
    """Per-token attention over time: q [F, T, Dm] against its own token's keys [S, T, Dm]."""
    Fb, T, Dm = q.shape
    hd = Dm // heads
    qh = q.reshape(Fb, T, heads, hd).permute(1, 2, 0, 3)  # [T, H, F, hd]
    kh = k.float().reshape(-1, T, heads, hd).permute(1, 2, 0, 3)
    vh = v.float().reshape(-1, T, heads, hd).permute(1, 2, 0, 3)
    out = F.scaled_dot_product_attention(qh, kh, vh)  # [T, H, F, hd]
    return out.permute(2, 0, 1, 3).reshape(Fb, T, Dm)
