"""The few-step flow-matching schedule of the distilled streaming models (Self-Forcing, CausVid,
LongLive, Matrix-Game-2): a trained step list, subsampled by tier and warped by the timestep shift.

Learned from Self-Forcing's `warp_denoising_step` (`pipeline/causal_inference.py`) and the Wan
flow-matching scheduler it indexes: σ = shift·s / (1 + (shift − 1)·s) at s = t / 1000.
"""

from __future__ import annotations


def shifted_sigma(t: float, shift: float) -> float:
    """σ of trained timestep t under the flow-matching shift."""
    s = t / 1000.0
    return shift * s / (1 + (shift - 1) * s)


def schedule(step_list: tuple[int, ...], n: int, shift: float) -> list[float]:
    """σ of the n steps of tier n: the trained list evenly subsampled, always from the first (pure
    noise), each warped by the shift (1000/750/500/250 at shift 5 → σ 1, 0.9375, 0.833, 0.625)."""
    return [shifted_sigma(step_list[(i * len(step_list)) // n], shift) for i in range(n)]
