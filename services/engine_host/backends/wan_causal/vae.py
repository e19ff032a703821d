"""The Wan VAE decoder streamed block by block with a caller-held feature cache.

diffusers' `AutoencoderKLWan` decodes a video one latent frame at a time, each causal 3-D
convolution keeping its last two input frames in a list it owns (`_feat_map`). Here the session
owns that list as fixed-shape leaves (`vae/<i>`, one per cached convolution, `[1, C, 2, H, W]`):
before each latent frame the leaves are handed to `vae.decoder(..., feat_cache=...)`, and what the
decoder leaves in the list is copied back into them in place. Two substitutions keep the shapes
fixed and the bytes exact: a one-frame entry (after the session's first frame) is stored behind a
zero frame, and the "Rep" marker of a time upsampler behind two; a convolution pads missing
history with zeros, so both read exactly as the shorter entry does. The session's first frame is
decoded from an empty list (`first_chunk`), as diffusers does, so it gives one RGB frame, the others four.

The cache is a function of the last `history_frames` latent frames (the decoder's temporal receptive
field, in whole blocks), which the session keeps as a moved ring (`latents`): `rebuild` replays
them block by block from a zero cache, as they were first decoded, and gets the same bytes.
"""

from __future__ import annotations

import torch

from services.engine_host.backends.wan_causal.config import Arch

# Latent frames a decoder cache depends on, measured for the Wan 2.1 decoder layout (4 levels, 2
# residual blocks each, time upsampling in the last two: 12 causal convolutions at the latent rate,
# then 7 at twice and 13 at four times it): a latent 34 frames back still changes the cache, one 36
# back does not. tests/backends/test_wan_causal_weights.py rebuilds a wrapped history exactly.
RECEPTIVE_FRAMES = 35


def history_frames(a: Arch) -> int:
    return -(-RECEPTIVE_FRAMES // a.frames_per_block) * a.frames_per_block


def build(a: Arch, device: torch.device | str = "meta"):
    from diffusers import AutoencoderKLWan

    z = a.out_channels
    kw = {} if z == 16 else {"latents_mean": [0.0] * z, "latents_std": [1.0] * z}
    with torch.device(device):
        return AutoencoderKLWan(base_dim=a.vae_base_dim, z_dim=z, dim_mult=list(a.vae_dim_mult),
                                num_res_blocks=a.vae_res_blocks, temperal_downsample=[False, True, True], **kw)


def cache_shapes(a: Arch) -> list[tuple[int, ...]]:
    """Shapes of the decoder's cache entries, found by running it on the meta device (nothing is
    allocated): two latent frames, so every entry holds its steady two frames."""
    vae = build(a, "meta")
    cache: list = [None] * vae._cached_conv_counts["decoder"]
    x = torch.empty(1, a.out_channels, 1, a.latent_h, a.latent_w, device="meta")
    for first in (True, False):
        vae.decoder(x, feat_cache=cache, feat_idx=[0], first_chunk=first)
    return [tuple(t.shape) for t in cache if t is not None]  # diffusers counts one convolution it never caches


def _store(leaf: torch.Tensor, entry) -> None:
    if isinstance(entry, torch.Tensor):
        n = entry.shape[2]
        if n < leaf.shape[2]:
            leaf[:, :, : leaf.shape[2] - n].zero_()
        leaf[:, :, leaf.shape[2] - n:].copy_(entry)
    else:  # "Rep": a time upsampler that has seen only the first frame, read as zero history
        leaf.zero_()


def decode(vae, leaves: list[torch.Tensor], frames_done: int, z: torch.Tensor) -> torch.Tensor:
    """RGB in [-1, 1], [frames, 3, H, W], of normalized latents z [F, C, h, w] (the session's frames
    `frames_done`...); advances the cache leaves in place."""
    mean = torch.tensor(vae.config.latents_mean, dtype=torch.float32, device=z.device).view(1, -1, 1, 1)
    std = torch.tensor(vae.config.latents_std, dtype=torch.float32, device=z.device).view(1, -1, 1, 1)
    dtype = next(vae.parameters()).dtype
    x = vae.post_quant_conv((z * std + mean).to(dtype).permute(1, 0, 2, 3)[None])
    out = []
    for i in range(x.shape[2]):
        first = frames_done + i == 0
        cache = [None] * len(leaves) if first else list(leaves)
        out.append(vae.decoder(x[:, :, i:i + 1], feat_cache=cache, feat_idx=[0], first_chunk=first))
        for leaf, entry in zip(leaves, cache, strict=True):
            _store(leaf, entry)
    return torch.cat(out, 2).clamp(-1.0, 1.0)[0].permute(1, 0, 2, 3)


def rebuild(vae, a: Arch, leaves: list[torch.Tensor], latents: torch.Tensor, block: int) -> None:
    """The cache after `block` blocks, from the latent ring alone: the last `history_frames`
    frames replayed block by block (the shapes they were first decoded in) from a zero cache."""
    for t in leaves:
        t.zero_()
    F, H = a.frames_per_block, latents.shape[0]
    end = block * F
    for start in range(max(0, end - H), end, F):
        idx = torch.arange(start, start + F, device=latents.device) % H
        decode(vae, leaves, start, latents.index_select(0, idx))


def encode_image(vae, a: Arch, rgb: torch.Tensor) -> torch.Tensor:
    """Normalized latent [C, h, w] of one RGB image [3, H, W] in [-1, 1] (Matrix-Game-2's first frame)."""
    dtype = next(vae.parameters()).dtype
    mean = torch.tensor(vae.config.latents_mean, dtype=torch.float32, device=rgb.device).view(-1, 1, 1)
    std = torch.tensor(vae.config.latents_std, dtype=torch.float32, device=rgb.device).view(-1, 1, 1)
    z = vae.encode(rgb.to(dtype)[None, :, None]).latent_dist.mode()[0, :, 0].float()
    return (z - mean) / std
