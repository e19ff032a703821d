"""The backend interface every model implements, as three stages: encode → denoise → decode.

A session's state is a tree (nested dicts and lists) of tensors and scalar control values that
the backend creates from a seed and its init inputs (`SessionInit`: prompt, image, audio) and
then advances one block at a time, writing every tensor leaf in place (see `spec`). A session has
at most one block in flight, so its state is touched by one stage at a time, while different
sessions' blocks are in different stages. For the same seed, init inputs and inputs a backend is
bit-exact on the same machine. `docs/backends.md` is the porting guide.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import torch

from libs.errors import ConfigError
from libs.init_inputs import MAX_INIT_BYTES
from libs.schemas.common import InputItem
from libs.schemas.engine import SessionInit
from services.engine_host.backends import spec as specs

WEIGHT_SEED = 20260101  # weights are a pure function of this seed and the backend's config


@dataclass
class Output:
    """What one block produces for the frontend."""

    frames: torch.Tensor  # uint8 [F, 3, H, W]
    audio: torch.Tensor | None = None  # int16 [samples]
    # JSON events the block answers with (a talking head's `cleared`, `segment_done`): published with
    # the block, after it is journaled, as `OutputChunk`s of kind "event", one event per part
    events: list[bytes] = field(default_factory=list)


class Backend(Protocol):
    """Built as `cls(config, device)` from its msgpack `config_type`, once per (name, config) on a
    host and shared by every session of that config. Optional hooks (see the helpers below):
    `rebuild(state)` (required when the spec has `rebuildable` leaves), `forward_passes(tier)`,
    `block_media_s(block)`, `profile_state(seed)` (see `scratch_state`); optional attributes
    `init_kinds` and `max_init_bytes` (see `init_kinds`), `client_paced` (see `paced_output`)."""

    name: ClassVar[str]
    config_type: ClassVar[type]
    device: torch.device
    tiers: tuple[int, ...]  # the quality ladder, ascending: how many denoise steps a block takes
    media_s_per_block: float  # steady state; `block_media_s` when the first block differs
    input_kinds: frozenset[str]
    # Optional `max_input_bytes: int`: the largest item value it takes (text: UTF-8 bytes), published in
    # its profile rows so ingress refuses bigger items at the door (absent: ingress's own limit only).
    batchable: bool  # denoise_batch coalesces several sessions' blocks of one shape

    def config_bytes(self) -> bytes: ...

    def init_state(self, seed: int, init: SessionInit) -> dict: ...

    def state_spec(self) -> dict:
        """The state tree's layout (for the mover's manifest and to check installed trees): nested
        dicts/lists of `spec.TensorSpec` (or `(dtype, shape)`, a moved leaf) and scalar types."""
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


def block_generator(seed: int, block: int, salt: int = 0, device: torch.device | str = "cpu") -> torch.Generator:
    """The noise of one block: a pure function of the session seed and block index, drawn by a
    generator of its own on the session's device (never the global RNG, which sessions share)."""
    g = torch.Generator(device=device)
    g.manual_seed((seed * 1_000_003 + block * 7919 + salt) % (2**63 - 1))
    return g


def check_backend(backend: Backend) -> None:
    """Refuse a backend whose spec needs a hook it lacks (at build time, not at the first move)."""
    spec = backend.state_spec()
    roles = {leaf.role for _, leaf in specs.leaves(spec) if isinstance(leaf, specs.TensorSpec)}
    if "rebuildable" in roles and not callable(getattr(backend, "rebuild", None)):
        raise ConfigError(f"backend {backend.name} declares rebuildable leaves but has no rebuild(state)",
                          backend=backend.name)


def init_kinds(backend: Backend) -> frozenset[str]:
    """The session init inputs a backend starts from (of `libs.init_inputs.INIT_KINDS`): its
    `init_kinds` attribute, by default the prompt alone. A session given another kind is refused
    (admission answers 422), never started with it silently ignored."""
    return frozenset(getattr(backend, "init_kinds", ("prompt",)))


def max_init_bytes(backend: Backend) -> int:
    """The most image + audio bytes a session of this backend starts from (`max_init_bytes`, at
    most the bus-wide `MAX_INIT_BYTES`)."""
    return min(getattr(backend, "max_init_bytes", MAX_INIT_BYTES) or MAX_INIT_BYTES, MAX_INIT_BYTES)


def paced_output(backend: Backend) -> bool:
    """Whether a C1 session's blocks wait for their playout point (engine_host/playout.py). Yes unless
    the backend says its clients pace the media themselves (`client_paced = True`): a voice agent's
    transport plays the audio at real time and shows each frame with its audio, so a hold on the
    sending side would only add up to a period to the agent's audio-to-face latency."""
    return not getattr(backend, "client_paced", False)


def scratch_state(backend: Backend, seed: int = 0) -> dict:
    """A session state the start-up profile times blocks on, from no user input: the backend's
    `profile_state(seed)` where it has one (a backend whose init needs a user's data, such as a
    table of precomputed prompt embeddings or an init image, builds stand-ins of the real shapes
    there, since what a block costs depends on shapes, not on what a prompt says), else
    `init_state` from a placeholder prompt."""
    hook = getattr(backend, "profile_state", None)
    return hook(seed) if hook is not None else backend.init_state(seed, SessionInit(prompt="profile"))


def forward_passes(backend: Backend, tier: int) -> int:
    """Model forwards one block takes at `tier`: the denoise steps, plus a clean pass where the
    backend runs one to write its caches (what a quantum's cost scales with)."""
    hook = getattr(backend, "forward_passes", None)
    return hook(tier) if hook is not None else tier


def block_media_s(backend: Backend, block: int) -> float:
    """Media seconds block `block` (0-based) produces; the first block may differ (a causal VAE
    decodes its first latent frame to one frame)."""
    hook = getattr(backend, "block_media_s", None)
    return hook(block) if hook is not None else backend.media_s_per_block


def weights(shape: tuple[int, ...], g: torch.Generator, device: torch.device, scale: float | None = None) -> torch.Tensor:
    fan_in = shape[0]  # weights are [in, out]: y = x @ w
    w = torch.randn(shape, generator=g) * (scale if scale is not None else fan_in ** -0.5)
    return w.to(device)
