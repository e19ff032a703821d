"""A world model's action history: each latent frame is conditioned on the actions of the last
`frames` video frames before it (Matrix-Game-2: `4 × windows_size` = 12), not on the block's
newest action alone, so a session carries the tail of that history (a small `moved` leaf) and a
moved or replayed session reads the same windows.

Learned from Matrix-Game-2's `wan/modules/action_module.py` and its inference loop (the actions
of the frames before the session's first are its first action repeated).
"""

from __future__ import annotations

import torch

from services.engine_host.backends.inputs import Action


def advance_windows(hist: torch.Tensor, inputs: list[Action], *, latent_frames: int, video_per_latent: int,
                    first: bool) -> torch.Tensor:
    """Each of the block's latent frames' action windows, [latent_frames, frames, keys + 2]
    (frames = `hist.shape[0]`), and `hist` advanced in place to end at the block's last video frame.

    The block's `latent_frames · video_per_latent` video frames take its inputs in equal shares, in
    seq order; with none the last action holds. `first`: the session's first block (the history
    before it is its first action repeated)."""
    frames, n = hist.shape[0], latent_frames * video_per_latent
    if inputs:
        rows = torch.stack([torch.cat([x.keys, x.mouse]) for x in inputs]).to(hist.device)
        new = rows[torch.arange(n, device=hist.device) * len(inputs) // n]
    else:
        new = hist[-1:].expand(n, -1).clone()  # a copy: hist is rewritten below
    if first:
        hist.copy_(new[:1].expand_as(hist))
    seq = torch.cat([hist, new])  # video frames from `frames` before the block to its end
    windows = torch.stack([seq[video_per_latent * j: video_per_latent * j + frames] for j in range(latent_frames)])
    hist.copy_(seq[-frames:])
    return windows
