"""`DitWorldBackend`: the causal DiT served as a statefleet backend (weights, state layout, init,
the three stages and the optional hooks)."""

from __future__ import annotations

import math
from typing import ClassVar

import msgspec
import torch
import torch.nn.functional as F

from libs.errors import BadRequest
from libs.schemas.common import InputItem
from libs.schemas.engine import SessionInit
from services.engine_host.backends import weights as weights_mod
from services.engine_host.backends.action_history import advance_windows
from services.engine_host.backends.base import WEIGHT_SEED, Output, block_generator
from services.engine_host.backends.dit import blocks, decoder, ring
from services.engine_host.backends.dit.config import CONV_T, KEYS, DitConfig
from services.engine_host.backends.flow_schedule import schedule
from services.engine_host.backends.inputs import Action, parse_action
from services.engine_host.backends.spec import TensorSpec


def state_spec(c: DitConfig) -> dict:
    """The state layout of a config, computed without weights or state (the published-size check)."""
    kv = getattr(torch, c.kv_dtype)
    spec: dict = {"layers": [ring.layer_spec(c, kv, i < c.action_layers) for i in range(c.layers)]}
    if c.action_layers:  # the action history each frame's window is cut from
        spec["actions"] = TensorSpec(torch.float32, (c.action_frames, len(KEYS) + 2))
    if c.cond_channels:  # the init image's conditioning, concatenated to the session's first frame
        spec["image_cond"] = TensorSpec(torch.float32, (c.cond_channels, c.latent_h, c.latent_w), "static")
    return spec | {
        "latents": TensorSpec(torch.float32, (c.history_frames, c.latent_channels, c.latent_h, c.latent_w)),
        "vae": decoder.cache_spec(c, kv, c.vae_cache_role),
        "seed": int,
        "block": int,
    }


class DitWorldBackend:
    name: ClassVar[str] = "dit"
    config_type: ClassVar[type] = DitConfig
    init_kinds = frozenset({"prompt", "image"})  # the image, when given, sets the cross-attention context
    batchable = False  # every session attends its own cache; blocks run one session at a time

    def __init__(self, config: DitConfig | None = None, device: torch.device | str = "cpu") -> None:
        c = self.config = config or DitConfig()
        head_dim = c.dim // c.heads if c.heads > 0 else 0
        if (c.dim % c.heads or head_dim < 6 or head_dim % 2 or c.mouse_dim % c.mouse_heads
                or c.latent_h % c.patch or c.latent_w % c.patch
                or len(c.vae_channels) != len(c.vae_convs) or any(n % 2 for n in c.vae_convs)
                or c.frames_per_block < CONV_T - 1 or c.window_frames < c.frames_per_block or not c.step_list
                or not 0 <= c.action_layers <= c.layers or c.action_window < 1
                or c.cond_channels not in (0, 4 + c.latent_channels)):
            raise BadRequest("dit config: dim/heads (an even head dim ≥ 6, for the 3-axis RoPE), patch/latent, "
                             "vae levels (pairs of convs), block ≥ 2 frames, window ≥ block, action layers "
                             "within the layers and cond_channels 0 or 4 + latent_channels must agree", config=str(c))
        self.input_kinds = frozenset({"action"}) if c.action_layers else frozenset()
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
        self._spec = state_spec(c)

    # ------------------------------------------------------------ weights

    def weight_shapes(self) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
        shapes = {**blocks.weight_shapes(self.config), **decoder.weight_shapes(self.config)}
        return {k: (torch.float32, v) for k, v in shapes.items()}

    def _random(self, shapes: dict[str, tuple[torch.dtype, tuple[int, ...]]]) -> weights_mod.Weights:
        g = torch.Generator().manual_seed(WEIGHT_SEED + 2)
        out = {}
        for name, (_, shape) in shapes.items():
            if name.endswith("_norm"):  # RMSNorm weights start at one
                out[name] = torch.ones(shape, device=self.device)
                continue
            fan_in = shape[0] if len(shape) == 2 else math.prod(shape[1:])
            if name.startswith("ctx_"):
                fan_in = 1
            if name.endswith("mod"):  # adaLN tables, as Wan initialises them: randn / sqrt(dim)
                fan_in = shape[-1]
            scale = fan_in ** -0.5 * (0.1 if name.endswith((".o", "_o", "mlp2", "out", "t2")) else 1.0)
            out[name] = (torch.randn(shape, generator=g) * scale).to(self.device)
        return out

    def config_bytes(self) -> bytes:
        return msgspec.msgpack.encode(self.config)

    # ------------------------------------------------------------ state

    def state_spec(self) -> dict:
        return self._spec

    def init_state(self, seed: int, init: SessionInit) -> dict:
        """Caches start empty (a ring fills as frames are written); the cross-attention cache and
        the image conditioning are pure functions of the init image or prompt (role `static`)."""
        ctx = self._context(init)

        def zeros(spec: TensorSpec) -> torch.Tensor:
            return torch.zeros(spec.shape, dtype=spec.dtype, device=self.device)

        spec = self._spec
        layers = []
        for i, lspec in enumerate(spec["layers"]):
            layer = {k: zeros(s) for k, s in lspec.items() if k not in ("cross_k", "cross_v")}
            ck, cv = blocks.cross_cache(self.w, i, ctx)
            layer["cross_k"], layer["cross_v"] = ck.to(self.kv_dtype), cv.to(self.kv_dtype)
            layers.append(layer)
        state: dict = {"layers": layers}
        if "actions" in spec:
            state["actions"] = zeros(spec["actions"])
        if "image_cond" in spec:
            state["image_cond"] = self._image_cond(init)
        return state | {"latents": zeros(spec["latents"]), "vae": [zeros(s) for s in spec["vae"]], "seed": seed,
                        "block": 0}

    def _image_cond(self, init: SessionInit) -> torch.Tensor:
        """[4 + C, h, w]: a mask (ones: the first frame is given) and the init image pooled to the
        latent grid and projected to latent channels (upstream: its VAE latent); zeros without an image."""
        c = self.config
        if init.image is None:
            return torch.zeros(c.cond_channels, c.latent_h, c.latent_w, device=self.device)
        img = F.adaptive_avg_pool2d(self._pixels(init)[None], (c.latent_h, c.latent_w))[0]  # [3, h, w]
        z = torch.einsum("chw,cd->dhw", img * 2 - 1, self.w["cond_img"])
        return torch.cat([torch.ones(4, c.latent_h, c.latent_w, device=self.device), z]).contiguous()

    def _pixels(self, init: SessionInit) -> torch.Tensor:
        """The init image [3, H, W] in [0, 1]."""
        im = init.image
        assert im is not None
        if im.width <= 0 or im.height <= 0 or len(im.rgb) != im.width * im.height * 3:
            raise BadRequest("init image needs width·height·3 bytes of RGB", width=im.width, height=im.height)
        img = torch.frombuffer(bytearray(im.rgb), dtype=torch.uint8).reshape(im.height, im.width, 3)
        return img.permute(2, 0, 1).float().div(255).to(self.device)

    def _context(self, init: SessionInit) -> torch.Tensor:
        """[context_tokens, dim]: the init image pooled to a grid of tokens, else the prompt's bytes."""
        c, dev = self.config, self.device
        if init.image is not None:
            grid = F.adaptive_avg_pool2d(self._pixels(init)[None], (4, c.context_tokens))[0]  # [3, 4, C]
            return blocks.rms(grid.reshape(12, c.context_tokens).T @ self.w["ctx_img"])
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
        """Re-derive the decoder's feature cache from the moved latent history."""
        decoder.rebuild(self.config, self.w, state["vae"], state["latents"], state["block"])

    # ------------------------------------------------------------ stages

    def encode(self, state: dict, inputs: list[Action]) -> torch.Tensor | None:
        """Owns `actions`: the block's video frames take its inputs in equal shares (none: the last
        action holds); each latent frame's window is cut from the history and them."""
        c = self.config
        if not c.action_layers:
            return None
        return advance_windows(state["actions"], inputs, latent_frames=c.frames_per_block,
                               video_per_latent=c.temporal_up, first=state["block"] == 0)

    def denoise(self, state: dict, carry: torch.Tensor | None, steps: int) -> torch.Tensor:
        return self.denoise_batch([state], [carry], steps)[0]

    def denoise_batch(self, states: list[dict], carries: list, steps: int) -> list[torch.Tensor]:
        """Owns `layers` and `block`: few-step denoising, then the clean pass that writes the caches."""
        return [self._denoise_one(s, a, steps) for s, a in zip(states, carries, strict=True)]

    def _denoise_one(self, state: dict, windows: torch.Tensor | None, steps: int) -> torch.Tensor:
        """The shifted few-step schedule with re-noising between steps (x0 = x − σ·v, then
        x = (1 − σ')·x0 + σ'·ε), then the clean pass at t = 0 writing the caches."""
        c = self.config
        g = block_generator(state["seed"], state["block"], device=self.device)
        shape = (c.frames_per_block, c.latent_channels, c.latent_h, c.latent_w)
        x = torch.randn(shape, generator=g, device=self.device)
        cond = None
        if "image_cond" in state:  # the image on the session's first frame, zeros after (as upstream)
            cond = torch.zeros(c.frames_per_block, *state["image_cond"].shape, device=self.device)
            if state["block"] == 0:
                cond[0] = state["image_cond"]
        sigmas = schedule(c.step_list, steps, c.timestep_shift)
        x0 = x
        for i, sigma in enumerate(sigmas):
            x0 = x - sigma * blocks.forward(c, self.w, state, x, sigma, cond, windows, self.kv_dtype)
            if i + 1 < len(sigmas):
                nxt = sigmas[i + 1]
                x = (1 - nxt) * x0 + nxt * torch.randn(shape, generator=g, device=self.device)
        blocks.forward(c, self.w, state, x0, 0.0, cond, windows, self.kv_dtype)  # the clean pass: caches hold clean frames
        state["block"] += 1
        return x0

    def decode(self, state: dict, carry: torch.Tensor) -> Output:
        """Owns `latents` and `vae`: keep the block's latents for a rebuild, decode them to RGB."""
        c = self.config
        end = state["block"] * c.frames_per_block  # denoise already counted this block
        idx = torch.arange(end - c.frames_per_block, end, device=self.device) % c.history_frames
        state["latents"].index_copy_(0, idx, carry)
        rgb = decoder.decode(c, self.w, state["vae"], carry)  # [F, temporal_up, 3, H, W]
        frames = rgb.reshape(-1, *rgb.shape[2:])
        if end == c.frames_per_block:  # the session's first latent frame decodes to one frame
            frames = frames[c.temporal_up - 1:]
        return Output(frames=(frames * 255).round().to(torch.uint8).cpu())
