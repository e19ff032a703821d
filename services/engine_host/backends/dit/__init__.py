"""`dit`: a causal DiT world model in the Matrix-Game-2 / Self-Forcing shape, at a configurable size.

A block is `frames_per_block` (3) latent frames. Each is denoised in a few steps taken from a
trained step list (tier n takes n of them, always starting at 1000), then one clean pass at
t = 0 runs the denoised latents through the model once more to write the caches, as Self-Forcing
and Matrix-Game-2 do. The modules, one concept each:

- `config`: `DitConfig` (`DitConfig.matrix_game_2()` is the published Matrix-Game-2 size,
  352×640, 30 layers) and the step schedule;
- `ring`: the per-layer KV caches (self-attention, mouse, keyboard over a sink + a rolling window
  written as a ring; the `static` cross-attention cache of the init image or prompt);
- `blocks`: the transformer pass that reads and writes those caches;
- `decoder`: the causal VAE-style decoder and its `rebuildable` feature cache;
- `backend`: `DitWorldBackend`, the statefleet backend around them (weights random from a fixed
  seed or from a safetensors file named with its sha256, shared by every session on the host;
  per-block noise from a generator seeded by (session seed, block) on the session's device).
"""

from services.engine_host.backends.dit.backend import DitWorldBackend, state_spec
from services.engine_host.backends.dit.config import CONV_T, KEYS, DitConfig

__all__ = ["CONV_T", "KEYS", "DitConfig", "DitWorldBackend", "state_spec"]
