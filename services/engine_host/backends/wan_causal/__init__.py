"""`wan_causal`: the Wan 2.1 1.3B transformer driven block-causally with a KV cache, the base of the
published streaming models (Self-Forcing, LongLive, Matrix-Game-2; `config.PRESETS`).

diffusers' `WanTransformer3DModel` and `AutoencoderKLWan` are used as they are (the extra
`statefleet[wan]` pins the diffusers whose attention-processor call this relies on); statefleet adds:

- `attention`: an `attn1` processor writing RoPE'd keys and values into the session's ring in
  place and attending over its filled slots; an `attn2` processor over a static cross-attention cache;
- `action`: Matrix-Game-2's keyboard and mouse module (not in diffusers), over ring caches;
- `forward`: the block-causal pass through diffusers' block modules, per-frame adaLN;
- `vae`: the Wan decoder streamed with a caller-held, fixed-shape feature cache, and its rebuild;
- `layout`: the per-session state of a config, computed without allocating;
- `model`, `embed`: weights (random or a local directory, sha256-checked) and prompt/image embeddings;
- `backend`: `WanCausalBackend`. Nothing here imports diffusers until a backend is built.
"""

from services.engine_host.backends.wan_causal.backend import WanCausalBackend
from services.engine_host.backends.wan_causal.config import PRESETS, Arch, WanCausalConfig

__all__ = ["PRESETS", "Arch", "WanCausalBackend", "WanCausalConfig"]
