"""One block-causal pass of the transformer over a block's frames, driving diffusers' block
modules directly: its stock forward has no cache and no place for the action module.

Per block (diffusers' `WanTransformerBlock` order, Self-Forcing's per-frame adaLN): self-attention
over the ring (`attn1`, `RingSelfAttention`), cross-attention over the static cache (`attn2`,
`StaticCrossAttention`), the action module where the block has one (Matrix-Game-2, blocks 0–14),
then the GELU-tanh FFN; shift, scale and gate come per frame from that frame's timestep.
"""

from __future__ import annotations

import torch

from services.engine_host.backends.wan_causal.attention import rope_tables
from services.engine_host.backends.wan_causal.config import Arch


def forward(a: Arch, m, x: torch.Tensor, timesteps: torch.Tensor, f0: int, kv_of, layers: list[dict],
            actions: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
    """The flow prediction [F, C_out, h, w] for latents x [F, C_in, h, w] (the block's frames from
    absolute frame f0) at per-frame timesteps [F]. `kv_of(i)` gives layer i's cache access (see
    `attention`); `layers[i]` holds its cross-attention cache; `actions` is (mouse, keys) per frame."""
    tr = m.transformer
    Fb, T, D = x.shape[0], a.tokens, a.dim
    dtype = tr.proj_out.weight.dtype
    hs = tr.patch_embedding(x.to(dtype).permute(1, 0, 2, 3)[None]).flatten(2).transpose(1, 2)  # [1, F·T, D]
    x3 = hs.reshape(Fb, T, D)
    ce = tr.condition_embedder
    temb = ce.time_embedder(ce.timesteps_proj(timesteps.to(torch.float32)))  # [F, D], float32
    mod = ce.time_proj(ce.act_fn(temb).to(dtype)).unflatten(1, (6, D))  # [F, 6, D]
    rotary = rope_tables(a, f0, Fb, x.device)
    for i, blk in enumerate(tr.blocks):
        shift, scale, gate, c_shift, c_scale, c_gate = (blk.scale_shift_table + mod.float()).chunk(6, dim=1)
        n = (blk.norm1(x3.float()) * (1 + scale) + shift).type_as(x3)
        y = blk.attn1(n.reshape(1, Fb * T, D), None, None, rotary, kv=kv_of(i), frames=Fb)
        x3 = (x3.float() + y.reshape(Fb, T, D) * gate).type_as(x3)
        n = blk.norm2(x3.float()).type_as(x3)
        x3 = x3 + blk.attn2(n.reshape(1, Fb * T, D), None, None, None, layer=layers[i]).reshape(Fb, T, D)
        if str(i) in m.actions:
            assert actions is not None  # a preset with action blocks always passes them
            x3 = m.actions[str(i)](x3, actions[0], actions[1], f0, kv_of(i))
        n = (blk.norm3(x3.float()) * (1 + c_scale) + c_shift).type_as(x3)
        x3 = (x3.float() + blk.ffn(n).float() * c_gate).type_as(x3)
    shift, scale = (tr.scale_shift_table + temb[:, None]).chunk(2, dim=1)  # [F, 1, D]
    out = tr.proj_out((tr.norm_out(x3.float()) * (1 + scale) + shift).type_as(x3))  # [F, T, C·4]
    hp, wp = a.latent_h // 2, a.latent_w // 2
    out = out.reshape(1, Fb, hp, wp, 1, 2, 2, -1).permute(0, 7, 1, 4, 2, 5, 3, 6)
    return out.flatten(6, 7).flatten(4, 5).flatten(2, 3)[0].permute(1, 0, 2, 3).float()
