"""`dit`: a causal DiT world model in the Matrix-Game-2 / Self-Forcing shape, at a configurable size.

A block is `frames_per_block` (3) latent frames. Each is denoised in a few steps taken from a
trained step list (tier n takes n of them, always starting at 1000), then one clean pass at
t = 0 runs the denoised latents through the model once more to write the caches, as Self-Forcing
and Matrix-Game-2 do. Per layer the state holds a dict of

- `k`, `v`: self-attention keys and values over `sink_frames` fixed frames plus a rolling window
  of `window_frames`, written as a ring: frame f goes to slot f (sink) or
  `sink + (f - sink) % window`, in place. Frames are the outermost axis, so a block's writes are
  contiguous and a pre-copy round resends only the frames it wrote (upstream shifts the window
  with a clone, which rewrites every byte every block);
- `mouse_k`, `mouse_v`: the mouse-action module's per-token temporal cache (frame-major too);
- `kbd_k`, `kbd_v`: the keyboard module's per-frame cache;
- `cross_k`, `cross_v`: the cross-attention cache of the init image or prompt, role `static`
  (regenerated from the init inputs, never sent).

A causal VAE-style decoder turns each latent frame into `temporal_up` RGB frames (the session's
first latent frame into one, as a causal video VAE does); every causal 3-D convolution keeps
its last two input frames in a feature cache, role `rebuildable`: a destination replays the
decoder over the last `history_frames` latents (moved, a small ring) and gets the same bytes,
because the decoder's temporal receptive field is 2 frames per convolution.

Weights are random from a fixed seed, or loaded from a safetensors file named with its sha256
in the config; either way shared by every session on the host. Per-block noise comes from a
generator seeded by (session seed, block) on the session's device.
`DitConfig.matrix_game_2()` is the published Matrix-Game-2 size (352×640, 30 layers).
"""

from __future__ import annotations

import math
from typing import ClassVar, Literal

import msgspec
import torch
import torch.nn.functional as F

from libs.errors import BadRequest
from libs.schemas.common import InputItem
from libs.schemas.engine import SessionInit
from services.engine_host.backends import weights as weights_mod
from services.engine_host.backends.base import WEIGHT_SEED, Output, block_generator
from services.engine_host.backends.inputs import Action, parse_action
from services.engine_host.backends.spec import TensorSpec

KEYS = ("w", "a", "s", "d", "space", "shift")
CONV_T = 3  # temporal kernel of the decoder's causal convolutions; each caches CONV_T - 1 input frames


class DitConfig(msgspec.Struct, frozen=True, kw_only=True):
    layers: int = 2
    dim: int = 32
    heads: int = 2
    latent_channels: int = 4
    latent_h: int = 4
    latent_w: int = 6
    patch: int = 2
    frames_per_block: int = 3
    sink_frames: int = 0
    window_frames: int = 6
    mouse_dim: int = 16
    mouse_heads: int = 1
    keyboard_dim: int = 16
    context_tokens: int = 8  # cross-attention tokens from the init image or prompt
    step_list: tuple[int, ...] = (1000, 750, 500, 250)  # the trained few-step schedule
    vae_channels: tuple[int, ...] = (16, 8)  # decoder levels; each after the first doubles H and W
    vae_convs: tuple[int, ...] = (2, 2)  # causal convolutions per level, in residual pairs
    temporal_up: int = 4  # RGB frames per latent frame (the first latent frame of a session gives 1)
    fps: float = 25.0
    kv_dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    vae_cache_role: Literal["rebuildable", "moved"] = "rebuildable"
    weights_path: str = ""  # a local safetensors file; empty: random weights from a fixed seed
    weights_sha256: str = ""

    @property
    def tokens(self) -> int:
        return (self.latent_h // self.patch) * (self.latent_w // self.patch)

    @property
    def slots(self) -> int:
        return self.sink_frames + self.window_frames

    @property
    def causal_convs(self) -> int:
        return 1 + sum(self.vae_convs) + 1  # conv_in, the levels, the head

    @property
    def history_frames(self) -> int:
        """Latent frames the decoder's feature cache depends on: its receptive field, in whole blocks."""
        need = (CONV_T - 1) * self.causal_convs
        return -(-need // self.frames_per_block) * self.frames_per_block

    @staticmethod
    def matrix_game_2() -> DitConfig:
        """Matrix-Game-2's published shape: 352×640 at 25 fps (latent 16×44×80, 2×2 patches: 880
        tokens per frame), 30 layers of width 1536, a 6-frame local window in bf16, mouse and
        keyboard modules of width 1024, 257 image tokens, steps [1000, 666, 333], and a Wan-style
        decoder (384/384/192/96 channels doubling to 352×640)."""
        return DitConfig(layers=30, dim=1536, heads=12, latent_channels=16, latent_h=44, latent_w=80, patch=2,
                         frames_per_block=3, sink_frames=0, window_frames=6, mouse_dim=1024, mouse_heads=16,
                         keyboard_dim=1024, context_tokens=257, step_list=(1000, 666, 333),
                         vae_channels=(384, 384, 192, 96), vae_convs=(10, 6, 6, 6), kv_dtype="bfloat16")


def _schedule(step_list: tuple[int, ...], n: int) -> list[int]:
    """n timesteps of the trained list, evenly spaced, always starting from the first (pure noise)."""
    return [step_list[(i * len(step_list)) // n] for i in range(n)]


def _rms(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(dim, keepdim=True) + 1e-6)


class DitWorldBackend:
    name: ClassVar[str] = "dit"
    config_type: ClassVar[type] = DitConfig
    input_kinds = frozenset({"action"})
    batchable = False  # every session attends its own cache; blocks run one session at a time

    def __init__(self, config: DitConfig | None = None, device: torch.device | str = "cpu") -> None:
        c = self.config = config or DitConfig()
        if (c.dim % c.heads or c.mouse_dim % c.mouse_heads or c.latent_h % c.patch or c.latent_w % c.patch
                or len(c.vae_channels) != len(c.vae_convs) or any(n % 2 for n in c.vae_convs)
                or c.frames_per_block < CONV_T - 1 or c.window_frames < c.frames_per_block or not c.step_list):
            raise BadRequest("dit config: dim/heads, patch/latent, vae levels (pairs of convs), block ≥ 2 frames "
                             "and window ≥ block must agree", config=str(c))
        self.device = torch.device(device)
        self.tiers = tuple(range(1, len(c.step_list) + 1))
        self.media_s_per_block = c.frames_per_block * c.temporal_up / c.fps
        self.kv_dtype = getattr(torch, c.kv_dtype)
        shapes = self.weight_shapes()
        # One module per host for each (source, architecture): configs that differ only in serving
        # knobs (tiers, fps, cache roles) share it.
        arch = tuple(sorted((k, v[1]) for k, v in shapes.items()))
        if c.weights_path:
            key: tuple = ("dit", c.weights_path, c.weights_sha256, arch, str(self.device))
            self.w = weights_mod.shared(key, lambda: weights_mod.load(c.weights_path, c.weights_sha256, shapes,
                                                                        self.device))
        else:
            self.w = weights_mod.shared(("dit", "random", arch, str(self.device)), lambda: self._random(shapes))
        self._spec = self._build_spec()

    # ------------------------------------------------------------ weights

    def weight_shapes(self) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
        c = self.config
        D, Dm, Dk, P = c.dim, c.mouse_dim, c.keyboard_dim, c.latent_channels * c.patch * c.patch
        s: dict[str, tuple[int, ...]] = {
            "patch_in": (P, D), "pos": (c.tokens, D), "t1": (D, D), "t2": (D, 6 * D), "out": (D, P),
            "ctx_img": (3 * 4, D), "ctx_text": (256, D),
        }
        for i in range(c.layers):
            for n, shape in (("q", (D, D)), ("k", (D, D)), ("v", (D, D)), ("o", (D, D)),
                             ("kbd_in", (len(KEYS), Dk)), ("kbd_q", (D, Dk)), ("kbd_k", (Dk, Dk)),
                             ("kbd_v", (Dk, Dk)), ("kbd_o", (Dk, D)), ("mouse_q", (D, Dm)), ("mouse_k", (D, Dm)),
                             ("mouse_v", (D, Dm)), ("mouse_in", (2, Dm)), ("mouse_o", (Dm, D)),
                             ("cross_q", (D, D)), ("cross_k", (D, D)), ("cross_v", (D, D)), ("cross_o", (D, D)),
                             ("mlp1", (D, 4 * D)), ("mlp2", (4 * D, D))):
                s[f"layers.{i}.{n}"] = shape
        chans = c.vae_channels
        s["vae.conv_in"] = (chans[0], c.latent_channels, CONV_T, 3, 3)
        for lvl, (ch, n) in enumerate(zip(chans, c.vae_convs, strict=True)):
            for j in range(n):
                s[f"vae.{lvl}.{j}"] = (ch, ch, CONV_T, 3, 3)
            if lvl + 1 < len(chans):
                s[f"vae.{lvl}.up"] = (ch, chans[lvl + 1])
        s["vae.head"] = (3 * c.temporal_up, chans[-1], CONV_T, 3, 3)
        return {k: (torch.float32, v) for k, v in s.items()}

    def _random(self, shapes: dict[str, tuple[torch.dtype, tuple[int, ...]]]) -> weights_mod.Weights:
        g = torch.Generator().manual_seed(WEIGHT_SEED + 2)
        out = {}
        for name, (_, shape) in shapes.items():
            fan_in = shape[0] if len(shape) == 2 else math.prod(shape[1:])
            if name == "pos" or name.startswith("ctx_"):
                fan_in = 1
            scale = fan_in ** -0.5 * (0.1 if name.endswith((".o", "_o", "mlp2", "out", "t2")) else 1.0)
            out[name] = (torch.randn(shape, generator=g) * scale).to(self.device)
        return out

    def config_bytes(self) -> bytes:
        return msgspec.msgpack.encode(self.config)

    # ------------------------------------------------------------ state

    def _build_spec(self) -> dict:
        c = self.config
        kv, S, T = self.kv_dtype, c.slots, c.tokens
        layer = {
            "k": TensorSpec(kv, (S, T, c.dim)), "v": TensorSpec(kv, (S, T, c.dim)),
            "mouse_k": TensorSpec(kv, (S, T, c.mouse_dim)), "mouse_v": TensorSpec(kv, (S, T, c.mouse_dim)),
            "kbd_k": TensorSpec(kv, (S, c.keyboard_dim)), "kbd_v": TensorSpec(kv, (S, c.keyboard_dim)),
            "cross_k": TensorSpec(kv, (c.context_tokens, c.dim), "static"),
            "cross_v": TensorSpec(kv, (c.context_tokens, c.dim), "static"),
        }
        vae = [TensorSpec(kv, (CONV_T - 1, cin, h, w), c.vae_cache_role) for cin, h, w in self._conv_inputs()]
        return {
            "layers": [dict(layer) for _ in range(c.layers)],
            "latents": TensorSpec(torch.float32, (c.history_frames, c.latent_channels, c.latent_h, c.latent_w)),
            "vae": vae,
            "action": TensorSpec(torch.float32, (len(KEYS) + 2,)),
            "seed": int,
            "block": int,
        }

    def _conv_inputs(self) -> list[tuple[int, int, int]]:
        """(channels, height, width) of each causal convolution's input, in decoder order."""
        c = self.config
        out = [(c.latent_channels, c.latent_h, c.latent_w)]
        h, w = c.latent_h, c.latent_w
        for lvl, (ch, n) in enumerate(zip(c.vae_channels, c.vae_convs, strict=True)):
            if lvl:
                h, w = 2 * h, 2 * w
            out += [(ch, h, w)] * n
        return out + [(c.vae_channels[-1], h, w)]

    def state_spec(self) -> dict:
        return self._spec

    def init_state(self, seed: int, init: SessionInit) -> dict:
        """Caches start empty (a ring fills as frames are written); the cross-attention cache is a
        pure function of the init image or prompt (role `static`)."""
        ctx = self._context(init)

        def zeros(spec: TensorSpec) -> torch.Tensor:
            return torch.zeros(spec.shape, dtype=spec.dtype, device=self.device)

        layers = []
        for i, spec in enumerate(self._spec["layers"]):
            layer = {k: zeros(s) for k, s in spec.items() if k not in ("cross_k", "cross_v")}
            layer["cross_k"] = (ctx @ self.w[f"layers.{i}.cross_k"]).to(self.kv_dtype)
            layer["cross_v"] = (ctx @ self.w[f"layers.{i}.cross_v"]).to(self.kv_dtype)
            layers.append(layer)
        return {"layers": layers, "latents": zeros(self._spec["latents"]), "vae": [zeros(s) for s in self._spec["vae"]],
                "action": torch.zeros(len(KEYS) + 2, device=self.device), "seed": seed, "block": 0}

    def _context(self, init: SessionInit) -> torch.Tensor:
        """[context_tokens, dim]: the init image pooled to a grid of tokens, else the prompt's bytes."""
        c, dev = self.config, self.device
        if init.image is not None:
            im = init.image
            if im.width <= 0 or im.height <= 0 or len(im.rgb) != im.width * im.height * 3:
                raise BadRequest("init image needs width·height·3 bytes of RGB", width=im.width, height=im.height)
            img = torch.frombuffer(bytearray(im.rgb), dtype=torch.uint8).reshape(im.height, im.width, 3)
            img = img.permute(2, 0, 1).float().div(255).to(dev)[None]
            grid = F.adaptive_avg_pool2d(img, (4, c.context_tokens))[0]  # [3, 4, C]
            return _rms(grid.reshape(12, c.context_tokens).T @ self.w["ctx_img"])
        raw = init.prompt.encode()
        if not raw:
            return torch.zeros(c.context_tokens, c.dim, device=dev)
        emb = self.w["ctx_text"][torch.tensor(list(raw), device=dev)]
        parts = torch.tensor_split(emb, min(c.context_tokens, len(raw)))
        pooled = torch.stack([p.mean(0) for p in parts])
        return torch.cat([pooled, pooled.new_zeros(c.context_tokens - len(parts), c.dim)])

    def parse_input(self, item: InputItem) -> Action:
        return parse_action(item, KEYS)

    # ------------------------------------------------------------ protocol hooks

    def forward_passes(self, tier: int) -> int:
        return tier + 1  # the denoise steps, and the clean pass that writes the caches

    def block_media_s(self, block: int) -> float:
        c = self.config
        frames = c.frames_per_block * c.temporal_up - (c.temporal_up - 1 if block == 0 else 0)
        return frames / c.fps

    def rebuild(self, state: dict) -> None:
        """Re-derive the decoder's feature cache from the moved latents: replay the decoder over the
        last `history_frames` latent frames, block by block as they were first decoded (same shapes,
        so the same bytes), from an empty cache."""
        c = self.config
        for t in state["vae"]:
            t.zero_()
        end = state["block"] * c.frames_per_block
        H = c.history_frames
        for start in range(max(0, end - H), end, c.frames_per_block):
            idx = torch.arange(start, start + c.frames_per_block, device=self.device) % H
            self._vae(state, state["latents"].index_select(0, idx))

    # ------------------------------------------------------------ stages

    def encode(self, state: dict, inputs: list[Action]) -> torch.Tensor:
        """Owns `action`: the block's last action holds for its frames and sticks until the next."""
        if inputs:
            state["action"].copy_(torch.cat([inputs[-1].keys, inputs[-1].mouse]).to(self.device))
        return state["action"].clone()

    def denoise(self, state: dict, carry: torch.Tensor, steps: int) -> torch.Tensor:
        return self.denoise_batch([state], [carry], steps)[0]

    def denoise_batch(self, states: list[dict], carries: list[torch.Tensor], steps: int) -> list[torch.Tensor]:
        """Owns `layers` and `block`: few-step denoising, then the clean pass that writes the caches."""
        return [self._denoise_one(s, a, steps) for s, a in zip(states, carries, strict=True)]

    def _denoise_one(self, state: dict, action: torch.Tensor, steps: int) -> torch.Tensor:
        c = self.config
        g = block_generator(state["seed"], state["block"], device=self.device)
        shape = (c.frames_per_block, c.latent_channels, c.latent_h, c.latent_w)
        x = torch.randn(shape, generator=g, device=self.device)
        ts = _schedule(c.step_list, steps)
        x0 = x
        for i, t in enumerate(ts):
            sigma = t / 1000.0
            x0 = x - sigma * self._forward(state, x, sigma, action)
            if i + 1 < len(ts):
                nxt = ts[i + 1] / 1000.0
                x = (1 - nxt) * x0 + nxt * torch.randn(shape, generator=g, device=self.device)
        self._forward(state, x0, 0.0, action)  # the clean pass: the caches now hold the clean frames
        state["block"] += 1
        return x0

    def _slots(self, f0: int) -> tuple[torch.Tensor, int]:
        """Ring slots of the block's frames and how many slots hold a frame once they are written."""
        c = self.config
        frames = range(f0, f0 + c.frames_per_block)
        slots = [f if f < c.sink_frames else c.sink_frames + (f - c.sink_frames) % c.window_frames for f in frames]
        return torch.tensor(slots, device=self.device), min(f0 + c.frames_per_block, c.slots)

    def _forward(self, state: dict, lat: torch.Tensor, sigma: float, action: torch.Tensor) -> torch.Tensor:
        """One model pass over the block's frames at noise level sigma; writes the caches' slots of
        these frames in place and attends over every filled slot. Returns the predicted velocity."""
        c, w = self.config, self.w
        Fb, T, D, p = c.frames_per_block, c.tokens, c.dim, c.patch
        f0 = state["block"] * Fb
        slots, filled = self._slots(f0)
        hp, wp = c.latent_h // p, c.latent_w // p
        tok = lat.reshape(Fb, c.latent_channels, hp, p, wp, p).permute(0, 2, 4, 1, 3, 5).reshape(Fb, T, -1)
        x = tok @ w["patch_in"] + w["pos"]  # [F, T, D]
        mod = (F.silu(self._t_embed(sigma) @ w["t1"]) @ w["t2"]).chunk(6)
        frames = torch.arange(f0, f0 + Fb, device=self.device, dtype=torch.float32)
        keys_held, mouse = action[: len(KEYS)], action[len(KEYS):]
        for i, cache in enumerate(state["layers"]):
            lw = {n: w[f"layers.{i}.{n}"] for n in ("q", "k", "v", "o", "kbd_in", "kbd_q", "kbd_k", "kbd_v", "kbd_o",
                                                      "mouse_q", "mouse_k", "mouse_v", "mouse_in", "mouse_o",
                                                      "cross_q", "cross_o", "mlp1", "mlp2")}
            h = _rms(x) * (1 + mod[0]) + mod[1]
            q, k = self._rope(h @ lw["q"], frames), self._rope(h @ lw["k"], frames)
            cache["k"].index_copy_(0, slots, k.to(self.kv_dtype))
            cache["v"].index_copy_(0, slots, (h @ lw["v"]).to(self.kv_dtype))
            x = x + mod[2] * (self._attend(q, cache["k"][:filled], cache["v"][:filled], c.heads) @ lw["o"])
            # keyboard: one key/value per frame, attended by every token
            kb = keys_held @ lw["kbd_in"]
            cache["kbd_k"].index_copy_(0, slots, (kb @ lw["kbd_k"]).expand(Fb, -1).to(self.kv_dtype))
            cache["kbd_v"].index_copy_(0, slots, (kb @ lw["kbd_v"]).expand(Fb, -1).to(self.kv_dtype))
            hn = _rms(x)
            kq = (hn @ lw["kbd_q"]).reshape(Fb * T, 1, -1)
            kbd = self._attend(kq, cache["kbd_k"][:filled, None], cache["kbd_v"][:filled, None], 1)
            # mouse: each token attends its own history of (hidden state + mouse) over the window
            m = mouse @ lw["mouse_in"]
            cache["mouse_k"].index_copy_(0, slots, (hn @ lw["mouse_k"] + m).to(self.kv_dtype))
            cache["mouse_v"].index_copy_(0, slots, (hn @ lw["mouse_v"] + m).to(self.kv_dtype))
            ms = self._temporal(hn @ lw["mouse_q"], cache["mouse_k"][:filled], cache["mouse_v"][:filled])
            x = x + kbd.reshape(Fb, T, -1) @ lw["kbd_o"] + ms @ lw["mouse_o"]
            cq = (_rms(x) @ lw["cross_q"]).reshape(1, Fb * T, D)
            cross = self._attend(cq, cache["cross_k"][None], cache["cross_v"][None], c.heads)
            x = x + cross.reshape(Fb, T, D) @ lw["cross_o"]
            x = x + mod[5] * (F.gelu((_rms(x) * (1 + mod[4]) + mod[3]) @ lw["mlp1"]) @ lw["mlp2"])
        out = _rms(x) @ w["out"]  # [F, T, C·p·p]
        return out.reshape(Fb, hp, wp, c.latent_channels, p, p).permute(0, 3, 1, 4, 2, 5).reshape(lat.shape)

    def _t_embed(self, sigma: float) -> torch.Tensor:
        half = self.config.dim // 2
        freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32, device=self.device) / half)
        ang = sigma * 1000.0 * freqs
        return torch.cat([ang.sin(), ang.cos()])

    def _rope(self, x: torch.Tensor, frames: torch.Tensor) -> torch.Tensor:
        """Rotary position of each token's frame, per head (keys are cached already rotated)."""
        c = self.config
        Fb, T, D = x.shape
        hd = D // c.heads
        freqs = torch.exp(-math.log(10000.0) * torch.arange(0, hd, 2, dtype=torch.float32, device=x.device) / hd)
        ang = frames[:, None] * freqs[None]  # [F, hd/2]
        cos, sin = ang.cos()[:, None, None], ang.sin()[:, None, None]
        xh = x.reshape(Fb, T, c.heads, hd // 2, 2)
        a, b = xh[..., 0], xh[..., 1]
        return torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).reshape(Fb, T, D)

    @staticmethod
    def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int) -> torch.Tensor:
        """Queries [.., Tq, D] over keys/values [S, Tk, D] (all filled slots, every token)."""
        D = q.shape[-1]
        hd = D // heads
        qh = q.reshape(-1, heads, hd).transpose(0, 1)
        kh = k.float().reshape(-1, heads, hd).transpose(0, 1)
        vh = v.float().reshape(-1, heads, hd).transpose(0, 1)
        out = F.scaled_dot_product_attention(qh, kh, vh)
        return out.transpose(0, 1).reshape(q.shape)

    def _temporal(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Per-token attention over time: q [F, T, Dm] against its own token's keys [S, T, Dm]."""
        H = self.config.mouse_heads
        Fb, T, Dm = q.shape
        hd = Dm // H
        qh = q.reshape(Fb, T, H, hd).permute(1, 2, 0, 3)  # [T, H, F, hd]
        kh = k.float().reshape(-1, T, H, hd).permute(1, 2, 0, 3)
        vh = v.float().reshape(-1, T, H, hd).permute(1, 2, 0, 3)
        out = F.scaled_dot_product_attention(qh, kh, vh)  # [T, H, F, hd]
        return out.permute(2, 0, 1, 3).reshape(Fb, T, Dm)

    def decode(self, state: dict, carry: torch.Tensor) -> Output:
        """Owns `latents` and `vae`: keep the block's latents for a rebuild, decode them to RGB."""
        c = self.config
        end = state["block"] * c.frames_per_block  # denoise already counted this block
        idx = torch.arange(end - c.frames_per_block, end, device=self.device) % c.history_frames
        state["latents"].index_copy_(0, idx, carry)
        rgb = self._vae(state, carry)  # [F, temporal_up, 3, H, W]
        frames = rgb.reshape(-1, *rgb.shape[2:])
        if end == c.frames_per_block:  # the session's first latent frame decodes to one frame
            frames = frames[c.temporal_up - 1:]
        return Output(frames=(frames * 255).round().to(torch.uint8).cpu())

    def _vae(self, state: dict, lat: torch.Tensor) -> torch.Tensor:
        c, w = self.config, self.w
        caches = iter(state["vae"])
        x = self._conv(lat, w["vae.conv_in"], next(caches))
        for lvl, n in enumerate(c.vae_convs):
            if lvl:
                x = F.interpolate(x, scale_factor=2.0, mode="nearest")
                x = torch.einsum("fchw,cd->fdhw", x, w[f"vae.{lvl - 1}.up"])
            for j in range(0, n, 2):
                y = self._conv(F.silu(_rms(x, 1)), w[f"vae.{lvl}.{j}"], next(caches))
                x = x + self._conv(F.silu(_rms(y, 1)), w[f"vae.{lvl}.{j + 1}"], next(caches))
        out = torch.sigmoid(self._conv(F.silu(_rms(x, 1)), w["vae.head"], next(caches)))
        Fb, _, H, W = out.shape
        return out.reshape(Fb, c.temporal_up, 3, H, W)

    def _conv(self, x: torch.Tensor, weight: torch.Tensor, cache: torch.Tensor) -> torch.Tensor:
        """A causal 3-D convolution over frames [F, C, H, W]: the cached last input frames stand in
        front, and the newest become the cache (in place)."""
        seq = torch.cat([cache.float(), x])  # [CONV_T - 1 + F, C, H, W]
        cache.copy_(seq[-(CONV_T - 1):])
        y = F.conv3d(seq.permute(1, 0, 2, 3)[None], weight, padding=(0, 1, 1))[0]  # [Cout, F, H, W]
        return y.permute(1, 0, 2, 3)
