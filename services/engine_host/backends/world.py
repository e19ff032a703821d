"""`world`: an action-conditioned causal transformer world model with a window-rewrite KV cache.

Each block denoises T new latent tokens (one frame) attending to a sliding window
of W = 4T/3 cached tokens, then writes the new tokens' keys and values into the
ring cache in place: three quarters of the cache change every block, as in the
window-rewrite world models statefleet is built for. Latents decode to a small
RGB frame, upscaled to a size a person can see. The cache is
`layers·2·W·d_model·4` bytes: from a few MB (defaults) to several GB
(`WorldConfig.for_state_bytes(4 << 30)`).
"""

from __future__ import annotations

import json
import math
from typing import Any, ClassVar

import crc32c
import msgspec
import torch
import torch.nn.functional as F

from libs.errors import BadRequest
from libs.schemas.common import InputItem
from libs.schemas.engine import SessionInit
from services.engine_host.backends.base import WEIGHT_SEED, Output, block_generator, weights

KEYS = ("w", "a", "s", "d", "space", "shift")
ACTION_DIM = len(KEYS) + 2  # key bits + mouse (dx, dy)
MOUSE_MAX = 1000.0


class WorldConfig(msgspec.Struct, frozen=True, kw_only=True):
    d_model: int = 64
    layers: int = 2
    heads: int = 4
    grid_h: int = 6  # tokens per block T = grid_h * grid_w (must be divisible by 3)
    grid_w: int = 8
    patch: int = 4  # each token decodes to a patch×patch RGB patch
    upscale: int = 8  # frames are shown `upscale` times larger (each pixel a block): 192×256 by default
    tiers: tuple[int, ...] = (1, 2, 4)
    fps: float = 15.0  # one frame per block

    @property
    def tokens(self) -> int:
        return self.grid_h * self.grid_w

    @property
    def window(self) -> int:
        return self.tokens * 4 // 3

    @property
    def cache_bytes(self) -> int:
        return self.layers * 2 * self.window * self.d_model * 4

    @property
    def state_bytes(self) -> int:
        return self.cache_bytes + self.tokens * self.d_model * 4 + self.window * 8 + ACTION_DIM * 4

    @staticmethod
    def for_state_bytes(target: int, d_model: int = 256, layers: int = 4) -> WorldConfig:
        """The config whose session state (cache + latents) is closest to `target` bytes."""
        per_window_slot = d_model * 4 * (2 * layers + 0.75)  # K and V per layer, plus 3/4 slot of latent
        window = max(64, round(target / per_window_slot / 64) * 64)
        tokens = window * 3 // 4  # a multiple of 48: grid 16 wide
        return WorldConfig(d_model=d_model, layers=layers, heads=4, grid_h=tokens // 16, grid_w=16)


class WorldBackend:
    name: ClassVar[str] = "world"
    config_type: ClassVar[type] = WorldConfig
    input_kinds = frozenset({"action"})
    batchable = True

    def __init__(self, config: WorldConfig | None = None, device: torch.device | str = "cpu") -> None:
        c = self.config = config or WorldConfig()
        if c.tokens % 3 or c.d_model % c.heads:
            raise BadRequest("world config needs tokens divisible by 3 and d_model by heads", config=str(c))
        self.device = torch.device(device)
        self.tiers = tuple(sorted(c.tiers))
        self.media_s_per_block = 1.0 / c.fps
        g = torch.Generator().manual_seed(WEIGHT_SEED)
        D, dev = c.d_model, self.device
        self.layers = [
            {name: weights(shape, g, dev) for name, shape in
             (("q", (D, D)), ("k", (D, D)), ("v", (D, D)), ("o", (D, D)), ("w1", (D, 4 * D)), ("w2", (4 * D, D)))}
            for _ in range(c.layers)
        ]
        self.action_w = weights((ACTION_DIM, D), g, dev, scale=0.5)
        self.decoder = weights((D, 3 * c.patch * c.patch), g, dev)
        self.pe_freq = torch.exp(torch.arange(0, D, 2, dtype=torch.float64) * (-math.log(10000.0) / D))

    def config_bytes(self) -> bytes:
        return msgspec.msgpack.encode(self.config)

    # ------------------------------------------------------------ state

    def init_state(self, seed: int, init: SessionInit) -> dict:
        c = self.config
        g = block_generator(seed, -1, crc32c.crc32c(init.prompt.encode()))
        kv = (torch.randn((c.layers, 2, c.window, c.d_model), generator=g) * 0.1).to(self.device)
        return {
            "kv": kv,
            "pos": torch.arange(c.window, dtype=torch.int64, device=self.device),
            "latent": (torch.randn((c.tokens, c.d_model), generator=g) * 0.1).to(self.device),
            "action": torch.zeros(ACTION_DIM, device=self.device),
            "seed": seed,
            "block": 0,
            "next_pos": c.window,
        }

    def state_spec(self) -> dict:
        """The state tree's layout: tensor leaves as (dtype, shape), scalars as their type."""
        c = self.config
        return {"kv": (torch.float32, (c.layers, 2, c.window, c.d_model)), "pos": (torch.int64, (c.window,)),
                "latent": (torch.float32, (c.tokens, c.d_model)), "action": (torch.float32, (ACTION_DIM,)),
                "seed": int, "block": int, "next_pos": int}

    def parse_input(self, item: InputItem) -> torch.Tensor:
        if item.kind != "action":
            raise BadRequest(f"world takes action inputs, not {item.kind}", session_id=item.session_id, seq=item.seq)
        try:
            value = json.loads(item.data)
        except ValueError:
            raise BadRequest("action data is not JSON", session_id=item.session_id, seq=item.seq) from None
        if not isinstance(value, dict) or set(value) - {"keys", "mouse"}:
            raise BadRequest('action must be an object with only "keys" and "mouse"', session_id=item.session_id,
                             seq=item.seq)
        keys, mouse = value.get("keys", []), value.get("mouse", [0, 0])
        if not isinstance(keys, list) or any(k not in KEYS for k in keys):
            raise BadRequest(f"action keys must be a list drawn from {KEYS}", session_id=item.session_id,
                             seq=item.seq)
        if (not isinstance(mouse, list) or len(mouse) != 2
                or any(isinstance(m, bool) or not isinstance(m, (int, float)) or not abs(m) <= MOUSE_MAX
                       for m in mouse)):
            raise BadRequest(f"action mouse must be [dx, dy] with |d| <= {MOUSE_MAX}", session_id=item.session_id,
                             seq=item.seq)
        bits = [1.0 if k in keys else 0.0 for k in KEYS]
        return torch.tensor(bits + [m / MOUSE_MAX for m in mouse], dtype=torch.float32)

    # ------------------------------------------------------------ stages

    def encode(self, state: dict, inputs: list[Any]) -> torch.Tensor:
        """Owns `action`: the latest action sticks until the next one (keys held down)."""
        if inputs:
            state["action"].copy_(inputs[-1])
        return state["action"] @ self.action_w

    def denoise(self, state: dict, carry: torch.Tensor, steps: int) -> torch.Tensor:
        return self.denoise_batch([state], [carry], steps)[0]

    def denoise_batch(self, states: list[dict], carries: list[torch.Tensor], steps: int) -> list[torch.Tensor]:
        """Owns `kv`, `pos`, `latent`, `block`, `next_pos`. Projections and MLPs run batched over the
        sessions; attention runs per session against its own cache."""
        c = self.config
        T = c.tokens
        qpos = [s["next_pos"] + torch.arange(T, device=self.device) for s in states]
        cond = torch.stack([carry + self._pe(p) for carry, p in zip(carries, qpos, strict=True)])  # [B, T, D]
        noise = torch.stack([torch.randn((T, c.d_model), generator=block_generator(s["seed"], s["block"]))
                             for s in states]).to(self.device)
        x = 0.5 * torch.stack([s["latent"] for s in states]) + 0.5 * noise
        masks = [self._mask(s["pos"], p) for s, p in zip(states, qpos, strict=True)]
        new_kv: list[torch.Tensor] = []
        for _ in range(steps):
            h, new_kv = self._forward(states, x + cond, masks)
            x = x - (x - h) / steps
        for b, s in enumerate(states):
            slots = qpos[b] % c.window
            s["kv"].index_copy_(2, slots, new_kv[b])  # in place: 3/4 of the window rewritten
            s["pos"].index_copy_(0, slots, qpos[b])
            s["latent"].copy_(x[b])
            s["block"] += 1
            s["next_pos"] += T
        return list(x.unbind(0))

    def _forward(self, states: list[dict], h: torch.Tensor, masks: list[torch.Tensor]):
        D = h.shape[-1]
        kvs = []
        for li, w in enumerate(self.layers):
            x = F.layer_norm(h, (D,))
            q, k, v = x @ w["q"], x @ w["k"], x @ w["v"]
            kvs.append(torch.stack([k, v], dim=1))  # [B, 2, T, D]
            att = []
            for b, s in enumerate(states):
                keys = torch.cat([s["kv"][li, 0], k[b]])
                vals = torch.cat([s["kv"][li, 1], v[b]])
                att.append(self._attend(q[b], keys, vals, masks[b]))
            h = h + torch.stack(att) @ w["o"]
            h = h + F.gelu(F.layer_norm(h, (D,)) @ w["w1"]) @ w["w2"]
        new_kv = torch.stack(kvs, dim=1)  # [B, L, 2, T, D]
        return h, list(new_kv.unbind(0))

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        H = self.config.heads
        T, D = q.shape
        split = lambda t: t.reshape(t.shape[0], H, D // H).transpose(0, 1)  # noqa: E731
        out = F.scaled_dot_product_attention(split(q), split(k), split(v), attn_mask=mask)
        return out.transpose(0, 1).reshape(T, D)

    def _mask(self, cache_pos: torch.Tensor, qpos: torch.Tensor) -> torch.Tensor:
        """Queries see cached tokens inside the sliding window and the new tokens causally."""
        W = self.config.window
        cached = (cache_pos[None, :] > qpos[:, None] - W) & (cache_pos[None, :] < qpos[:, None])
        causal = qpos[None, :] <= qpos[:, None]
        return torch.cat([cached, causal], dim=1)

    def _pe(self, pos: torch.Tensor) -> torch.Tensor:
        angles = pos.double().cpu()[:, None] * self.pe_freq[None, :]
        return torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(1).float().to(self.device)

    def decode(self, state: dict, carry: torch.Tensor) -> Output:
        c = self.config
        px = torch.sigmoid(carry @ self.decoder)  # [T, 3·p·p]
        img = px.reshape(c.grid_h, c.grid_w, 3, c.patch, c.patch).permute(2, 0, 3, 1, 4)
        img = img.reshape(1, 3, c.grid_h * c.patch, c.grid_w * c.patch)
        if c.upscale > 1:
            img = F.interpolate(img, scale_factor=c.upscale, mode="nearest")
        return Output(frames=(img * 255).round().clamp(0, 255).to(torch.uint8).cpu())
