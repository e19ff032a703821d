"""The backend interface every model implements, as three stages: encode → denoise → decode.

A session's state is a tree (dict) of tensors and scalar control values that the
backend creates from a seed and prompt and then advances one block at a time.
A session has at most one block in flight, so its state is touched by one stage
at a time, while different sessions' blocks are in different stages. Weights are
generated from a fixed seed; for the same seed, prompt and inputs a backend
is bit-exact on the same machine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import torch

from libs.schemas.common import InputItem

WEIGHT_SEED = 20260101  # weights are a pure function of this seed and the backend's config


@dataclass
class Output:
    """What one block produces for the frontend."""

    frames: torch.Tensor  # uint8 [F, 3, H, W]
    audio: torch.Tensor | None = None  # int16 [samples]


class Backend(Protocol):
    name: ClassVar[str]
    device: torch.device
    tiers: tuple[int, ...]  # the quality ladder: denoise steps, ascending
    media_s_per_block: float
    input_kinds: frozenset[str]
    batchable: bool  # denoise_batch coalesces several sessions' blocks of one shape

    def config_bytes(self) -> bytes: ...

    def init_state(self, seed: int, prompt: str) -> dict: ...

    def state_spec(self) -> dict:
        """The state tree's layout (for the mover's manifest and to check installed trees):
        tensor leaves as (dtype, shape), scalar control values as their Python type."""
        ...

    def parse_input(self, item: InputItem) -> Any:
        """The item's value as this backend uses it; a typed BadRequest for a wrong kind or shape."""
        ...

    def encode(self, state: dict, inputs: list[Any]) -> Any: ...

    def denoise(self, state: dict, carry: Any, steps: int) -> Any: ...

    def denoise_batch(self, states: list[dict], carries: list[Any], steps: int) -> list[Any]: ...

    def decode(self, state: dict, carry: Any) -> Output: ...


def advance(backend: Backend, state: dict, inputs: list[Any], steps: int) -> Output:
    """One whole block, the bare forward with no serving layer around it."""
    return backend.decode(state, backend.denoise(state, backend.encode(state, inputs), steps))


def block_generator(seed: int, block: int, salt: int = 0) -> torch.Generator:
    """The noise of one block: a pure function of the session seed and block index."""
    g = torch.Generator(device="cpu")
    g.manual_seed((seed * 1_000_003 + block * 7919 + salt) % (2**63 - 1))
    return g


def weights(shape: tuple[int, ...], g: torch.Generator, device: torch.device, scale: float | None = None) -> torch.Tensor:
    fan_in = shape[0]  # weights are [in, out]: y = x @ w
    w = torch.randn(shape, generator=g) * (scale if scale is not None else fan_in ** -0.5)
    return w.to(device)
