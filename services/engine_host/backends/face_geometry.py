"""A face drawn over an S×S frame: soft masks precomputed once, and the mouth per frame (the text
avatar and the talking head share it)."""

from __future__ import annotations

import torch


def to_uint8(img: torch.Tensor) -> torch.Tensor:
    return (img.clamp(0, 1) * 255).round().to(torch.uint8)


class FaceGeometry:
    """Soft masks of a face over an S×S frame, precomputed once (coordinates in [0, 1])."""

    def __init__(self, size: int, device: torch.device) -> None:
        self.size = size
        axis = (torch.arange(size, dtype=torch.float32, device=device) + 0.5) / size
        self.y, self.x = axis.view(-1, 1), axis.view(1, -1)
        self.face = self._disc(0.5, 0.52, 0.36, 0.36)
        self.shade = 1.0 - 0.35 * ((self.x - 0.42) ** 2 + (self.y - 0.4) ** 2).sqrt()  # light from top left
        self.eyes = torch.maximum(self._disc(0.37, 0.42, 0.045, 0.055), self._disc(0.63, 0.42, 0.045, 0.055))
        # the widest mouth (amp 0.5) spans x 0.5 ± 0.13, y 0.7 ± 0.092: its box, a little larger
        self.mouth_box = (slice(int(0.59 * size), int(0.81 * size) + 1), slice(int(0.35 * size), int(0.65 * size) + 1))

    def _disc(self, cx: float, cy: float, rx: float, ry: float) -> torch.Tensor:
        """1 inside the ellipse, 0 outside, with a soft edge about a pixel and a half wide."""
        d = (((self.x - cx) / rx) ** 2 + ((self.y - cy) / ry) ** 2).sqrt()
        return ((1 - d) * self.size * min(rx, ry) / 1.5).clamp(0, 1)

    def mouth(self, amp: torch.Tensor) -> torch.Tensor:
        """[F, 1, h, w] over `mouth_box`: one mouth per frame, open in proportion to its loudness `amp` in [0, 0.5]."""
        ys, xs = self.mouth_box
        ry = (0.012 + 0.16 * amp).view(-1, 1, 1, 1)
        d = (((self.x[:, xs] - 0.5) / 0.13) ** 2 + ((self.y[ys] - 0.7) / ry) ** 2).sqrt()
        return ((1 - d) * self.size * 0.012).clamp(0, 1)
