"""The per-layer KV caches: a sink plus a rolling window, written as a ring.

Frame f goes to slot f (sink) or `sink + (f - sink) % window`, in place, with frames the
outermost axis of every cache: a block's writes are contiguous, so a pre-copy round resends only
the frames it wrote (upstream shifts the window with a clone, which rewrites every byte every
block). Attention is order-free over keys once positions are applied before caching (keys are
stored rotated), so a ring gives the same output as the shifted window.
"""

from __future__ import annotations

import torch

from services.engine_host.backends.dit.config import DitConfig
from services.engine_host.backends.spec import TensorSpec


def layer_spec(c: DitConfig, kv: torch.dtype, actions: bool) -> dict[str, TensorSpec]:
    """One layer's caches: self-attention over the ring's slots; in a layer with the action module
    (`actions`: Matrix-Game-2's blocks 0-14) the mouse module's per-token temporal cache and the
    keyboard module's per-frame cache over the same slots; and the `static` cross-attention cache
    of the init image or prompt (regenerated from the init inputs, never sent)."""
    S, T = c.slots, c.tokens
    spec = {"k": TensorSpec(kv, (S, T, c.dim)), "v": TensorSpec(kv, (S, T, c.dim))}
    if actions:
        spec |= {"mouse_k": TensorSpec(kv, (S, T, c.mouse_dim)), "mouse_v": TensorSpec(kv, (S, T, c.mouse_dim)),
                 "kbd_k": TensorSpec(kv, (S, c.keyboard_dim)), "kbd_v": TensorSpec(kv, (S, c.keyboard_dim))}
    return spec | {"cross_k": TensorSpec(kv, (c.context_tokens, c.dim), "static"),
                   "cross_v": TensorSpec(kv, (c.context_tokens, c.dim), "static")}


def slots(c: DitConfig, f0: int, device: torch.device) -> tuple[torch.Tensor, int]:
    """Ring slots of the block's frames (starting at frame f0) and how many slots hold a frame
    once they are written."""
    frames = range(f0, f0 + c.frames_per_block)
    where = [f if f < c.sink_frames else c.sink_frames + (f - c.sink_frames) % c.window_frames for f in frames]
    return torch.tensor(where, device=device), min(f0 + c.frames_per_block, c.slots)
