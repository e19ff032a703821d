"""The causal VAE-style decoder: latent frames to RGB through causal 3-D convolutions.

Each latent frame becomes `temporal_up` RGB frames. Every causal convolution keeps its last
CONV_T - 1 input frames in a feature cache (role `rebuildable` by default): a destination replays
the decoder over the last `history_frames` latents (moved, a small ring) and gets the same bytes,
because the decoder's temporal receptive field is CONV_T - 1 frames per convolution.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from services.engine_host.backends.dit.blocks import Weights, rms
from services.engine_host.backends.dit.config import CONV_T, DitConfig
from services.engine_host.backends.spec import Role, TensorSpec


def weight_shapes(c: DitConfig) -> dict[str, tuple[int, ...]]:
    chans = c.vae_channels
    s = {"vae.conv_in": (chans[0], c.latent_channels, CONV_T, 3, 3)}
    for lvl, (ch, n) in enumerate(zip(chans, c.vae_convs, strict=True)):
        for j in range(n):
            s[f"vae.{lvl}.{j}"] = (ch, ch, CONV_T, 3, 3)
        if lvl + 1 < len(chans):
            s[f"vae.{lvl}.up"] = (ch, chans[lvl + 1])
    s["vae.head"] = (3 * c.temporal_up, chans[-1], CONV_T, 3, 3)
    return s


def cache_spec(c: DitConfig, dtype: torch.dtype, role: Role) -> list[TensorSpec]:
    """One feature cache per causal convolution, in decoder order."""
    return [TensorSpec(dtype, (CONV_T - 1, cin, h, w), role) for cin, h, w in _conv_inputs(c)]


def _conv_inputs(c: DitConfig) -> list[tuple[int, int, int]]:
    """(channels, height, width) of each causal convolution's input, in decoder order."""
    out = [(c.latent_channels, c.latent_h, c.latent_w)]
    h, w = c.latent_h, c.latent_w
    for lvl, (ch, n) in enumerate(zip(c.vae_channels, c.vae_convs, strict=True)):
        if lvl:
            h, w = 2 * h, 2 * w
        out += [(ch, h, w)] * n
    return out + [(c.vae_channels[-1], h, w)]


class _Enough(Exception):
    """A replay has updated every cache it needed from this block."""


def decode(c: DitConfig, w: Weights, caches: list[torch.Tensor], lat: torch.Tensor) -> torch.Tensor:
    """RGB [F, temporal_up, 3, H, W] in [0, 1] of latent frames [F, C, h, w]; advances the caches."""
    out = _run(c, w, caches, lat, None)
    Fb, _, H, W = out.shape
    return out.reshape(Fb, c.temporal_up, 3, H, W)


def _run(c: DitConfig, w: Weights, caches: list[torch.Tensor], lat: torch.Tensor, depth: int | None) -> torch.Tensor:
    """The decoder over `lat`. With a `depth`, only the first `depth` causal convolutions are fed:
    the one at `depth` takes its input into its cache without being computed, nothing after it
    runs, and `_Enough` is raised."""
    it = iter(caches)
    done = 0

    def conv(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        nonlocal done
        done += 1
        if done == depth:
            _remember(x, next(it))
            raise _Enough
        return _conv(x, weight, next(it))

    x = conv(lat, w["vae.conv_in"])
    for lvl, n in enumerate(c.vae_convs):
        if lvl:
            x = F.interpolate(x, scale_factor=2.0, mode="nearest")
            x = torch.einsum("fchw,cd->fdhw", x, w[f"vae.{lvl - 1}.up"])
        for j in range(0, n, 2):
            y = conv(F.silu(rms(x, 1)), w[f"vae.{lvl}.{j}"])
            x = x + conv(F.silu(rms(y, 1)), w[f"vae.{lvl}.{j + 1}"])
    return torch.sigmoid(conv(F.silu(rms(x, 1)), w["vae.head"]))


def rebuild(c: DitConfig, w: Weights, caches: list[torch.Tensor], latents: torch.Tensor, block: int) -> None:
    """Re-derive the feature caches from the latent history ring after `block` blocks: replay the
    decoder over the last `history_frames` latent frames, block by block as they were first decoded
    (same shapes, so the same bytes), from an empty cache.

    A cache holds its convolution's last CONV_T - 1 input frames, and each convolution looks
    CONV_T - 1 frames back, so convolution k (1-based, of N) needs its input only over the last
    (CONV_T - 1)·(N - k + 1) frames. A replayed block feeds just the convolutions that need it, and
    the deepest one it feeds only takes its input into the cache: the head never runs, and the
    older blocks stop after a few layers."""
    for t in caches:
        t.zero_()
    end = block * c.frames_per_block
    H, N = c.history_frames, len(caches)
    for start in range(max(0, end - H), end, c.frames_per_block):
        after = end - (start + c.frames_per_block)  # frames decoded after this block
        depth = sum(1 for k in range(1, N + 1) if (CONV_T - 1) * (N - k + 1) > after)
        if depth == 0:
            continue
        idx = torch.arange(start, start + c.frames_per_block, device=latents.device) % H
        try:
            _run(c, w, caches, latents.index_select(0, idx), depth)
        except _Enough:
            pass


def _remember(x: torch.Tensor, cache: torch.Tensor) -> None:
    """What `_conv` leaves in its cache, without the convolution."""
    cache.copy_(torch.cat([cache.float(), x])[-(CONV_T - 1):])


def _conv(x: torch.Tensor, weight: torch.Tensor, cache: torch.Tensor) -> torch.Tensor:
    """A causal 3-D convolution over frames [F, C, H, W]: the cached last input frames stand in
    front, and the newest become the cache (in place)."""
    seq = torch.cat([cache.float(), x])  # [CONV_T - 1 + F, C, H, W]
    cache.copy_(seq[-(CONV_T - 1):])
    y = F.conv3d(seq.permute(1, 0, 2, 3)[None], weight, padding=(0, 1, 1))[0]  # [Cout, F, H, W]
    return y.permute(1, 0, 2, 3)
