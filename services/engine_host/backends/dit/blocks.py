"""The transformer: one model pass over a block's frames through every layer, in Wan 2.1's block
order (self-attention over the ring, cross-attention to the init context, the keyboard and mouse
module in the first `action_layers` layers, the FFN), writing each layer's caches at the block's
ring slots in place.

As upstream (Wan 2.1's `WanAttentionBlock`, Self-Forcing's `CausalWanModel`): adaLN from a
per-frame timestep (a shared projection plus each layer's own table), q/k RMSNorm across heads
with a learned weight, a 3-axis RoPE over (frame, height, width) with the head split as Wan splits
it, a GELU-tanh FFN. Simplified, as docs/backends.md lists: one linear fewer in the time
embedding, no learned norm before cross-attention, and the action module's internals.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from services.engine_host.backends.dit import ring
from services.engine_host.backends.dit.config import KEYS, DitConfig

Weights = dict[str, torch.Tensor]

LAYER_WEIGHTS = ("q", "k", "v", "o", "q_norm", "k_norm", "mod", "cross_q", "cross_o", "cross_q_norm", "mlp1", "mlp2")
ACTION_WEIGHTS = ("kbd_in", "kbd_q", "kbd_k", "kbd_v", "kbd_o", "mouse_q", "mouse_k", "mouse_v", "mouse_in", "mouse_o")


def weight_shapes(c: DitConfig) -> dict[str, tuple[int, ...]]:
    D, Dm, Dk = c.dim, c.mouse_dim, c.keyboard_dim
    P_in, P_out = (c.latent_channels + c.cond_channels) * c.patch ** 2, c.latent_channels * c.patch ** 2
    s: dict[str, tuple[int, ...]] = {
        "patch_in": (P_in, D), "t1": (D, D), "t2": (D, 6 * D), "head_mod": (2, D), "out": (D, P_out),
        "ctx_img": (3 * 4, D), "ctx_text": (256, D),
    }
    if c.cond_channels:
        s["cond_img"] = (3, c.cond_channels - 4)
    for i in range(c.layers):
        shapes = {"q": (D, D), "k": (D, D), "v": (D, D), "o": (D, D), "q_norm": (D,), "k_norm": (D,), "mod": (6, D),
                  "cross_q": (D, D), "cross_k": (D, D), "cross_v": (D, D), "cross_o": (D, D), "cross_q_norm": (D,),
                  "cross_k_norm": (D,), "mlp1": (D, c.ffn_dim), "mlp2": (c.ffn_dim, D)}
        if i < c.action_layers:
            shapes |= {"kbd_in": (c.action_frames * len(KEYS), Dk), "kbd_q": (D, Dk), "kbd_k": (Dk, Dk),
                       "kbd_v": (Dk, Dk), "kbd_o": (Dk, D), "mouse_q": (D, Dm), "mouse_k": (D, Dm),
                       "mouse_v": (D, Dm), "mouse_in": (c.action_frames * 2, Dm), "mouse_o": (Dm, D)}
        s |= {f"layers.{i}.{n}": shape for n, shape in shapes.items()}
    return s


def rms(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(dim, keepdim=True) + 1e-6)


def _ln(x: torch.Tensor) -> torch.Tensor:
    """Wan's adaLN norm: LayerNorm without affine parameters."""
    return F.layer_norm(x, x.shape[-1:], eps=1e-6)


def cross_cache(w: Weights, i: int, ctx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Layer i's cross-attention keys (RMS-normed, as its queries) and values of the context [N, D]."""
    return rms(ctx @ w[f"layers.{i}.cross_k"]) * w[f"layers.{i}.cross_k_norm"], ctx @ w[f"layers.{i}.cross_v"]


def forward(c: DitConfig, w: Weights, state: dict, lat: torch.Tensor, sigma: float, cond: torch.Tensor | None,
            windows: torch.Tensor | None, kv_dtype: torch.dtype) -> torch.Tensor:
    """One model pass over the block's frames at noise level sigma (every frame's timestep; adaLN
    takes them per frame); `cond` [F, cond_channels, h, w] is concatenated to the latents and
    `windows` [F, action_frames, keys + 2] is each frame's action window. Writes the caches' slots
    of these frames in place and attends over every filled slot. Returns the predicted velocity."""
    device = lat.device
    Fb, T, D, p = c.frames_per_block, c.tokens, c.dim, c.patch
    f0 = state["block"] * Fb
    slots, filled = ring.slots(c, f0, device)
    hp, wp = c.latent_h // p, c.latent_w // p
    inp = lat if cond is None else torch.cat([lat, cond], dim=1)
    tok = inp.reshape(Fb, inp.shape[1], hp, p, wp, p).permute(0, 2, 4, 1, 3, 5).reshape(Fb, T, -1)
    x = tok @ w["patch_in"]  # [F, T, D]
    temb = F.silu(_t_embed(D, torch.full((Fb,), sigma * 1000.0, device=device)) @ w["t1"])  # [F, D]
    mod = (F.silu(temb) @ w["t2"]).reshape(Fb, 6, D)
    cos, sin = _rope_angles(c, f0, device)
    for i, cache in enumerate(state["layers"]):
        lw = {n: w[f"layers.{i}.{n}"] for n in LAYER_WEIGHTS + (ACTION_WEIGHTS if i < c.action_layers else ())}
        shift, scale, gate, c_shift, c_scale, c_gate = (mod + lw["mod"])[:, :, None].unbind(1)  # each [F, 1, D]
        h = _ln(x) * (1 + scale) + shift
        q = _rope(rms(h @ lw["q"]) * lw["q_norm"], cos, sin, c.heads)
        k = _rope(rms(h @ lw["k"]) * lw["k_norm"], cos, sin, c.heads)
        cache["k"].index_copy_(0, slots, k.to(kv_dtype))
        cache["v"].index_copy_(0, slots, (h @ lw["v"]).to(kv_dtype))
        x = x + gate * (_attend(q, cache["k"][:filled], cache["v"][:filled], c.heads) @ lw["o"])
        cq = (rms(_ln(x) @ lw["cross_q"]) * lw["cross_q_norm"]).reshape(1, Fb * T, D)
        cross = _attend(cq, cache["cross_k"][None], cache["cross_v"][None], c.heads)
        x = x + cross.reshape(Fb, T, D) @ lw["cross_o"]
        if i < c.action_layers:
            assert windows is not None  # a config with action layers always encodes them
            x = _action(c, lw, cache, x, windows, slots, filled, kv_dtype)
        x = x + c_gate * (F.gelu((_ln(x) * (1 + c_scale) + c_shift) @ lw["mlp1"], approximate="tanh") @ lw["mlp2"])
    shift, scale = (w["head_mod"] + temb[:, None])[:, :, None].unbind(1)
    out = (_ln(x) * (1 + scale) + shift) @ w["out"]  # [F, T, C·p·p]
    return out.reshape(Fb, hp, wp, c.latent_channels, p, p).permute(0, 3, 1, 4, 2, 5).reshape(lat.shape)


def _action(c: DitConfig, lw: Weights, cache: dict, x: torch.Tensor, windows: torch.Tensor, slots: torch.Tensor,
            filled: int, kv_dtype: torch.dtype) -> torch.Tensor:
    """The keyboard and mouse module (after cross-attention): each frame's action window embedded,
    a per-frame keyboard key/value attended by every token, and a per-token mouse history."""
    Fb, T, _ = x.shape
    keys, mouse = windows[..., : len(KEYS)].flatten(1), windows[..., len(KEYS):].flatten(1)
    kb = keys @ lw["kbd_in"]  # [F, Dk]
    cache["kbd_k"].index_copy_(0, slots, (kb @ lw["kbd_k"]).to(kv_dtype))
    cache["kbd_v"].index_copy_(0, slots, (kb @ lw["kbd_v"]).to(kv_dtype))
    hn = rms(x)
    kq = (hn @ lw["kbd_q"]).reshape(Fb * T, 1, -1)
    kbd = _attend(kq, cache["kbd_k"][:filled, None], cache["kbd_v"][:filled, None], 1)
    m = (mouse @ lw["mouse_in"])[:, None]  # [F, 1, Dm]: each token joins its frame's mouse window
    cache["mouse_k"].index_copy_(0, slots, (hn @ lw["mouse_k"] + m).to(kv_dtype))
    cache["mouse_v"].index_copy_(0, slots, (hn @ lw["mouse_v"] + m).to(kv_dtype))
    ms = _temporal(hn @ lw["mouse_q"], cache["mouse_k"][:filled], cache["mouse_v"][:filled], c.mouse_heads)
    return x + kbd.reshape(Fb, T, -1) @ lw["kbd_o"] + ms @ lw["mouse_o"]


def _t_embed(dim: int, t: torch.Tensor) -> torch.Tensor:
    """Sinusoidal embedding [F, dim] of per-frame timesteps t [F] (on the 0-1000 scale)."""
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
    ang = t[:, None] * freqs[None]
    return torch.cat([ang.cos(), ang.sin()], dim=1)


def rope_split(head_dim: int) -> tuple[int, int, int]:
    """Head dims rotated by frame, height and width, as Wan splits them."""
    return head_dim - 4 * (head_dim // 6), 2 * (head_dim // 6), 2 * (head_dim // 6)


def _rope_angles(c: DitConfig, f0: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [F, T, 1, head_dim / 2] of the 3-axis RoPE at the block's absolute frames."""
    hp, wp = c.latent_h // c.patch, c.latent_w // c.patch
    grid = torch.meshgrid(torch.arange(f0, f0 + c.frames_per_block, device=device),
                          torch.arange(hp, device=device), torch.arange(wp, device=device), indexing="ij")
    angles = []
    for n, pos in zip(rope_split(c.dim // c.heads), grid, strict=True):
        freqs = 1.0 / 10000.0 ** (torch.arange(0, n, 2, dtype=torch.float64, device=device) / n)
        angles.append(pos.reshape(c.frames_per_block, -1, 1).double() * freqs)
    ang = torch.cat(angles, dim=-1)[:, :, None].float()
    return ang.cos(), ang.sin()


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, heads: int) -> torch.Tensor:
    """Rotary positions in interleaved pairs, per head (keys are cached already rotated)."""
    Fb, T, D = x.shape
    xh = x.reshape(Fb, T, heads, D // heads // 2, 2)
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
