"""Matrix-Game-2's keyboard and mouse module, block-causal over ring caches (not in diffusers).

Learned from Matrix-Game-2's `wan/modules/action_module.py` (`ActionModule`, the action adapter of
arXiv 2501.08325) and written for a ring: it sits in blocks 0–14, after cross-attention and before
the FFN. Each latent frame i sees the actions of the `4·windows_size` video frames before video
frame 4i (the first action repeated before the session's start):

- mouse: per token, the hidden state joined with those mouse deltas → MLP → q, k, v (RMS-normed
  q, k, RoPE over the frame index on the first dims of each head) → attention over that token's own
  window of frames (cache `mouse_k/v`, `[slots, tokens, width]`: frames outermost, where upstream
  keeps `[tokens, frames, ...]` and so scatters a block's writes over the whole cache);
- keyboard: the keys of those frames embedded and flattened → one k, v per frame (cache
  `kbd_k/v`, `[slots, width]`), attended by every token's query.

Parameter names follow the upstream checkpoint (`blocks.N.action_model.*`), so its weights load
as they are. Upstream's q/k norms (`WanRMSNorm` there) hold a weight they never apply; so here.
"""

from __future__ import annotations

import torch
from torch import nn

from services.engine_host.backends.wan_causal.attention import attend
from services.engine_host.backends.wan_causal.config import Arch


class _UnweightedRms(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))  # in the checkpoint, not applied (as upstream)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + 1e-6)


def frame_rope(x: torch.Tensor, pos: torch.Tensor, dims: int, theta: float = 256.0) -> torch.Tensor:
    """x [..., frames, heads, head_dim] turned by the frame index on its first `dims` dims in
    interleaved pairs (upstream's 3-axis table with height and width at position 0, which leaves
    the other dims as they are)."""
    freqs = 1.0 / theta ** (torch.arange(0, dims, 2, dtype=torch.float64, device=x.device) / dims)
    ang = torch.outer(pos.to(torch.float64), freqs)  # [frames, dims/2]
    cos, sin = ang.cos().to(x.dtype)[:, None], ang.sin().to(x.dtype)[:, None]
    head, rest = x[..., :dims], x[..., dims:]
    a, b = head.unflatten(-1, (-1, 2)).unbind(-1)
    turned = torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2)
    return torch.cat([turned, rest], dim=-1)


class ActionModule(nn.Module):
    def __init__(self, a: Arch) -> None:
        super().__init__()
        self.a = a
        A, D, hd = a.action_dim, a.dim, a.action_dim // a.action_heads
        self.keyboard_embed = nn.Sequential(nn.Linear(a.keyboard_dim, a.action_hidden), nn.SiLU(),
                                            nn.Linear(a.action_hidden, a.action_hidden))
        self.mouse_mlp = nn.Sequential(nn.Linear(a.mouse_dim * a.action_frames + D, A), nn.GELU(approximate="tanh"),
                                       nn.Linear(A, A), nn.LayerNorm(A))
        self.t_qkv = nn.Linear(A, 3 * A, bias=False)
        self.img_attn_q_norm, self.img_attn_k_norm = _UnweightedRms(hd), _UnweightedRms(hd)
        self.proj_mouse = nn.Linear(A, D, bias=False)
        self.key_attn_q_norm, self.key_attn_k_norm = _UnweightedRms(hd), _UnweightedRms(hd)
        self.mouse_attn_q = nn.Linear(D, A, bias=False)
        self.keyboard_attn_kv = nn.Linear(a.action_hidden * a.action_frames, 2 * A, bias=False)
        self.proj_keyboard = nn.Linear(A, D, bias=False)

    def forward(self, x: torch.Tensor, mouse: torch.Tensor, keys: torch.Tensor, f0: int, kv) -> torch.Tensor:
        """x [F, T, D] (after cross-attention); mouse [F, 4·window, 2] and keys [F, 4·window, K]:
        each latent frame's action window; `kv` as in `attention` (names `mouse_`, `kbd_`)."""
        a = self.a
        Fb, T, _ = x.shape
        H, hd = a.action_heads, a.action_dim // a.action_heads
        pos = torch.arange(f0, f0 + Fb, device=x.device)
        # mouse: per token over time
        h = torch.cat([x, mouse.flatten(1).to(x.dtype)[:, None].expand(Fb, T, -1)], dim=-1)
        q, k, v = self.t_qkv(self.mouse_mlp(h)).unflatten(-1, (3, H, hd)).unbind(2)  # [F, T, H, hd]
        q = frame_rope(self.img_attn_q_norm(q).transpose(0, 1), pos, a.action_rope_dims)  # [T, F, H, hd]
        k = frame_rope(self.img_attn_k_norm(k).transpose(0, 1), pos, a.action_rope_dims)
        keys_, values, mask = kv("mouse_", k.transpose(0, 1).flatten(2), v.flatten(2))  # [S, T, A]
        keys_ = keys_.unflatten(-1, (H, hd)).transpose(0, 1)
        values = values.unflatten(-1, (H, hd)).transpose(0, 1)
        out = attend(q, keys_, values, mask)  # [T, F, A]
        x = x + self.proj_mouse(out.transpose(0, 1))
        # keyboard: one key and value per frame, for every token
        q = self.key_attn_q_norm(self.mouse_attn_q(x).unflatten(-1, (H, hd)))  # [F, T, H, hd]
        q = frame_rope(q.transpose(0, 1), pos, a.action_rope_dims)  # [T, F, H, hd]
        kb = self.keyboard_embed(keys.to(x.dtype)).flatten(1)  # [F, 4·window·hidden]
        k, v = self.keyboard_attn_kv(kb).unflatten(-1, (2, H, hd)).unbind(1)  # [F, H, hd]
        k = frame_rope(self.key_attn_k_norm(k), pos, a.action_rope_dims)
        keys_, values, mask = kv("kbd_", k.flatten(1), v.flatten(1))  # [S, A]
        keys_ = keys_.unflatten(-1, (H, hd))[None].expand(T, -1, -1, -1)
        values = values.unflatten(-1, (H, hd))[None].expand(T, -1, -1, -1)
        out = attend(q, keys_, values, mask)  # [T, F, A]
        return x + self.proj_keyboard(out.transpose(0, 1))
