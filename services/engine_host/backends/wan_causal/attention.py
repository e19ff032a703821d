"""Attention over the session's caches, as diffusers attention processors.

`RingSelfAttention` is set on every block's `attn1` (`set_processor`): it projects q, k, v with
the block's own layers and norms, applies the 3-axis RoPE at the block's absolute frames, writes
the rotated k and v into the session's preallocated ring in place and attends over the filled
slots. `StaticCrossAttention` on `attn2` attends to the cross-attention cache computed once per
prompt (or init image). Both take the session's caches per call (`kv=`), never keep them: one
module serves every session of the host.

A `kv` answers `kv(name, k, v) -> (keys, values, mask)`: `Ring` writes a block's frames at their
slots and returns every filled slot (no mask: a ring holds exactly the window); the tests'
full-sequence reference returns the whole sequence with a block-causal sliding-window mask.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from services.engine_host.backends.wan_causal.config import Arch


def ring_slots(a: Arch, f0: int, n: int) -> list[int]:
    """Slots of frames f0..f0+n: a frame of the sink keeps its slot, the others rotate in the window."""
    s, w = a.sink_frames, a.window_frames
    return [f if f < s else s + (f - s) % w for f in range(f0, f0 + n)]


class Ring:
    """One layer's caches at one block: frames outermost, `[slots, ...]`."""

    def __init__(self, layer: dict, slots: torch.Tensor, filled: int) -> None:
        self.layer, self.slots, self.filled = layer, slots, filled

    def __call__(self, name: str, k: torch.Tensor, v: torch.Tensor):
        ck, cv = self.layer[f"{name}k"], self.layer[f"{name}v"]
        ck.index_copy_(0, self.slots, k.to(ck.dtype))
        cv.index_copy_(0, self.slots, v.to(cv.dtype))
        return ck[: self.filled], cv[: self.filled], None


def rope_tables(a: Arch, f0: int, frames: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [1, frames·tokens, 1, head_dim] of diffusers' `WanRotaryPosEmbed` at absolute frames
    f0.. (its table stops at 1024 frames; a rolling session goes on past that, so the angles are
    computed here from the same formula)."""
    from diffusers.models.embeddings import get_1d_rotary_pos_embed

    hd = a.head_dim
    h_dim = w_dim = 2 * (hd // 6)
    t_dim = hd - h_dim - w_dim
    hp, wp = a.latent_h // 2, a.latent_w // 2
    parts = []
    for dim, pos in ((t_dim, torch.arange(f0, f0 + frames)), (h_dim, torch.arange(hp)), (w_dim, torch.arange(wp))):
        # diffusers annotates `pos` as ndarray | int but takes a tensor of positions as well
        parts.append(get_1d_rotary_pos_embed(dim, pos.to(torch.float64), 10000.0, use_real=True,  # type: ignore[arg-type]
                                             repeat_interleave_real=True, freqs_dtype=torch.float64))
    out = []
    for j in range(2):
        t, h, w = (p[j] for p in parts)
        grid = torch.cat([t.view(frames, 1, 1, -1).expand(frames, hp, wp, -1),
                          h.view(1, hp, 1, -1).expand(frames, hp, wp, -1),
                          w.view(1, 1, wp, -1).expand(frames, hp, wp, -1)], dim=-1)
        out.append(grid.reshape(1, frames * hp * wp, 1, hd).to(device))
    return out[0], out[1]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """diffusers' Wan rotation: interleaved pairs (x1, x2) of each head turned by the pair's angle."""
    x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
    c, s = cos[..., 0::2], sin[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = x1 * c - x2 * s
    out[..., 1::2] = x1 * s + x2 * c
    return out.type_as(x)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """q [B, Lq, H, d] over k, v [B, Lk, H, d] → [B, Lq, H·d]."""
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2).to(q.dtype), v.transpose(1, 2).to(q.dtype),
                                         attn_mask=mask)
    return out.transpose(1, 2).flatten(2)


class RingSelfAttention:
    """attn1: RoPE'd k and v of the block's frames go into the ring; queries attend the window."""

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, rotary_emb=None, *,
                 kv, frames: int):
        q = attn.norm_q(attn.to_q(hidden_states)).unflatten(2, (attn.heads, -1))
        k = attn.norm_k(attn.to_k(hidden_states)).unflatten(2, (attn.heads, -1))
        v = attn.to_v(hidden_states).unflatten(2, (attn.heads, -1))
        q, k = apply_rope(q, *rotary_emb), apply_rope(k, *rotary_emb)
        tokens = q.shape[1] // frames
        keys, values, mask = kv("", k[0].unflatten(0, (frames, tokens)).flatten(2),
                                v[0].unflatten(0, (frames, tokens)).flatten(2))
        keys = keys.reshape(1, -1, attn.heads, q.shape[-1])
        values = values.reshape(1, -1, attn.heads, q.shape[-1])
        if mask is not None:  # a frame mask, to tokens
            mask = mask.repeat_interleave(tokens, 0).repeat_interleave(tokens, 1)
        out = attend(q, keys, values, mask)
        return attn.to_out[1](attn.to_out[0](out))


class StaticCrossAttention:
    """attn2: queries over the session's cross-attention cache (`cross_k`, `cross_v`: [tokens, dim],
    the prompt's or image's keys and values, made once by `cross_cache`)."""

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, rotary_emb=None, *,
                 layer: dict):
        q = attn.norm_q(attn.to_q(hidden_states)).unflatten(2, (attn.heads, -1))
        k = layer["cross_k"].unflatten(1, (attn.heads, -1))[None]
        v = layer["cross_v"].unflatten(1, (attn.heads, -1))[None]
        return attn.to_out[1](attn.to_out[0](attend(q, k, v, None)))


def cross_cache(attn, context: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The keys and values attn2 takes from a context [tokens, dim] (projected, k normed)."""
    return attn.norm_k(attn.to_k(context)), attn.to_v(context)
