"""`WanCausalBackend`: a block-causal Wan 2.1 transformer served as a statefleet backend
(Self-Forcing, LongLive, Matrix-Game-2 by preset): weights, state, the three stages and the hooks."""

from __future__ import annotations

from typing import Any, ClassVar

import msgspec
import torch
import torch.nn.functional as F

from libs.errors import BadRequest, ConfigError
from libs.schemas.common import InputItem
from libs.schemas.engine import RawImage, SessionInit
from services.engine_host.backends import weights as weights_mod
from services.engine_host.backends.action_history import advance_windows
from services.engine_host.backends.base import Output, block_generator
from services.engine_host.backends.inputs import Action, parse_action
from services.engine_host.backends.spec import TensorSpec
from services.engine_host.backends.wan_causal import embed, layout
from services.engine_host.backends.wan_causal import vae as vae_mod
from services.engine_host.backends.wan_causal.attention import (
    Ring,
    RingSelfAttention,
    StaticCrossAttention,
    cross_cache,
    ring_slots,
)
from services.engine_host.backends.wan_causal.config import KEYS, WanCausalConfig, schedule
from services.engine_host.backends.wan_causal.forward import forward


class WanCausalBackend:
    name: ClassVar[str] = "wan_causal"
    config_type: ClassVar[type] = WanCausalConfig
    # A host serves it only when its config names it (weights are a user's to give): see docs/backends.md.
    opt_in: ClassVar[bool] = True
    batchable = False  # every session attends its own ring

    def __init__(self, config: WanCausalConfig | None = None, device: torch.device | str = "cpu") -> None:
        c = self.config = config or WanCausalConfig()
        a = self.arch = c.a
        if problem := layout.check_arch(a):
            raise BadRequest(f"wan_causal config: {problem}", config=str(c))
        if c.random_weights == bool(c.weights_dir):
            raise ConfigError("wan_causal needs its weights: weights_dir (a local Self-Forcing, LongLive or "
                              "Matrix-Game-2 checkpoint, with weights_sha256) or random_weights = true "
                              "(random weights, for benchmarks and tests only), and not both")
        try:
            import diffusers  # noqa: F401
        except ImportError:
            raise ConfigError("wan_causal needs diffusers: pip install 'statefleet[wan]'") from None
        self.device = torch.device(device)
        self.dtype = getattr(torch, c.dtype)
        self.input_kinds = frozenset({"action"}) if a.action_blocks else frozenset()
        self.init_kinds = frozenset({"image"}) if a.image_dim else frozenset({"prompt"})
        self.tiers = tuple(range(1, len(a.step_list) + 1))
        self.media_s_per_block = a.frames_per_block * 4 / a.fps
        # one copy of the weights per host for each (source, architecture, dtype, device)
        if c.random_weights:
            key: tuple = ("wan_causal", "random", a, c.dtype, str(self.device))
            w = weights_mod.shared(key, lambda: __import__(f"{__package__}.model", fromlist=["x"])
                                   .random_weights(a, self.dtype, self.device))
        else:
            key = ("wan_causal", c.weights_dir, c.weights_layout, tuple(sorted(c.weights_sha256.items())), a,
                   c.dtype, str(self.device))
            w = weights_mod.shared(key, lambda: self._model_mod().load_dir(c, self.dtype, self.device))
        self.m = self._model_mod().instantiate(a, w)
        for blk in self.m.transformer.blocks:
            blk.attn1.set_processor(RingSelfAttention())
            blk.attn2.set_processor(StaticCrossAttention())
        self.embedder = embed.make(c)
        self._spec = layout.state_spec(c)

    @staticmethod
    def _model_mod():
        from services.engine_host.backends.wan_causal import model

        return model

    def config_bytes(self) -> bytes:
        return msgspec.msgpack.encode(self.config)

    def state_spec(self) -> dict:
        return self._spec

    # ------------------------------------------------------------ state

    @torch.no_grad()
    def init_state(self, seed: int, init: SessionInit) -> dict:
        """Every leaf zero (a ring fills as frames are written) but the static ones: the
        cross-attention cache of the prompt or image, and Matrix-Game-2's image latent."""
        a = self.arch
        if a.image_dim:
            if init.image is None:
                raise BadRequest("this wan_causal config starts from an image (image to video)")
            emb = self.embedder.embed("image", init.image.rgb)
        else:
            emb = self.embedder.embed("text", init.prompt.encode())
        return self._state(seed, emb, init)

    @torch.no_grad()
    def profile_state(self, seed: int) -> dict:
        """The start-up profile's scratch session, from no user input. What a block costs depends on
        the shapes of its inputs, not on what a prompt says: the cross-attention cache is always
        `context_tokens` long (an embedding is padded to it), so a seeded stand-in embedding of that
        full shape times as a real one does. A user's precomputed embeddings need not hold any
        particular prompt, and an image-to-video config, which has no image at start-up, gets a
        stand-in image at the model's resolution (grey) for its image latent."""
        a = self.arch
        emb = torch.randn(a.context_tokens, a.image_dim or a.text_dim, generator=torch.Generator().manual_seed(seed))
        w, h = a.latent_w * 8, a.latent_h * 8
        image = RawImage(width=w, height=h, rgb=bytes([128]) * (w * h * 3)) if a.image_dim else None
        return self._state(seed, emb, SessionInit(image=image))

    def _state(self, seed: int, emb: torch.Tensor, init: SessionInit) -> dict:
        def zeros(spec: TensorSpec) -> torch.Tensor:
            return torch.zeros(spec.shape, dtype=spec.dtype, device=self.device)

        spec = self._spec
        context = self._context(emb)
        layers = []
        for blk, lspec in zip(self.m.transformer.blocks, spec["layers"], strict=True):
            ck, cv = (t.to(self.dtype).contiguous() for t in cross_cache(blk.attn2, context))
            static = {"cross_k": ck, "cross_v": cv}
            layers.append({k: static[k] if s.role == "static" else zeros(s) for k, s in lspec.items()})  # spec order
        state: dict[str, Any] = {"layers": layers}
        if "actions" in spec:
            state["actions"] = zeros(spec["actions"])
        if "image_cond" in spec:
            state["image_cond"] = self._image_cond(init)
        state |= {"latents": zeros(spec["latents"]), "vae": [zeros(s) for s in spec["vae"]], "seed": seed, "block": 0}
        return state

    def _context(self, emb: torch.Tensor) -> torch.Tensor:
        """The embedding checked, padded to `context_tokens` with zeros (as upstream) and projected."""
        a, ce = self.arch, self.m.transformer.condition_embedder
        proj = ce.image_embedder if a.image_dim else ce.text_embedder
        if emb.ndim != 2 or emb.shape[0] > a.context_tokens or emb.shape[1] != (a.image_dim or a.text_dim):
            raise BadRequest(f"embedding is {list(emb.shape)}, the model takes ≤ {a.context_tokens} tokens of "
                             f"{a.image_dim or a.text_dim}")
        emb = torch.cat([emb, emb.new_zeros(a.context_tokens - emb.shape[0], emb.shape[1])])  # padded, as upstream
        return proj(emb.to(self.device, self.dtype)[None])[0].to(self.dtype)

    def _image_cond(self, init: SessionInit) -> torch.Tensor:
        """4 mask channels (ones: the first frame is given) and the image's VAE latent, for frame 0."""
        a, im = self.arch, init.image
        if im is None or im.width <= 0 or im.height <= 0 or len(im.rgb) != im.width * im.height * 3:
            raise BadRequest("init image needs width·height·3 bytes of RGB")
        img = torch.frombuffer(bytearray(im.rgb), dtype=torch.uint8).reshape(im.height, im.width, 3)
        img = img.permute(2, 0, 1).float().div(127.5).sub(1)[None].to(self.device)
        img = F.interpolate(img, size=(a.latent_h * 8, a.latent_w * 8), mode="bilinear", align_corners=False)[0]
        z = vae_mod.encode_image(self.m.vae, a, img)
        mask = torch.ones(4, a.latent_h, a.latent_w, device=self.device)
        return torch.cat([mask, z]).contiguous()

    def parse_input(self, item: InputItem) -> Action:
        if not self.arch.action_blocks:
            raise BadRequest(f"this wan_causal config takes no per-block inputs, not {item.kind}",
                             session_id=item.session_id, seq=item.seq)
        return parse_action(item, KEYS)

    # ------------------------------------------------------------ hooks

    def forward_passes(self, tier: int) -> int:
        return tier + 1  # the denoise steps, and the clean pass that writes the caches

    def block_media_s(self, block: int) -> float:
        return (self.arch.frames_per_block * 4 - (3 if block == 0 else 0)) / self.arch.fps

    @torch.no_grad()
    def rebuild(self, state: dict) -> None:
        vae_mod.rebuild(self.m.vae, self.arch, state["vae"], state["latents"], state["block"])

    # ------------------------------------------------------------ stages

    def encode(self, state: dict, inputs: list[Action]) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Owns `actions`: the block's video frames take its inputs in equal shares, in order (none:
        the last action holds); each latent frame's window is cut from the history and them."""
        a = self.arch
        if not a.action_blocks:
            return None
        windows = advance_windows(state["actions"], inputs, latent_frames=a.frames_per_block, video_per_latent=4,
                                  first=state["block"] == 0)
        return windows[..., a.keyboard_dim:].contiguous(), windows[..., : a.keyboard_dim].contiguous()

    def denoise(self, state: dict, carry, steps: int) -> torch.Tensor:
        return self.denoise_batch([state], [carry], steps)[0]

    def denoise_batch(self, states: list[dict], carries: list, steps: int) -> list[torch.Tensor]:
        return [self._denoise_one(s, c, steps) for s, c in zip(states, carries, strict=True)]

    @torch.no_grad()
    def _denoise_one(self, state: dict, actions, steps: int) -> torch.Tensor:
        """Owns `layers` and `block`: the shifted few-step schedule with re-noising between steps
        (x0 = x − σ·v, then x = (1 − σ')·x0 + σ'·ε), then the clean pass at t = 0 writing the caches."""
        a, dev = self.arch, self.device
        Fb, f0 = a.frames_per_block, state["block"] * a.frames_per_block
        g = block_generator(state["seed"], state["block"], device=dev)
        shape = (Fb, a.out_channels, a.latent_h, a.latent_w)
        x = torch.randn(shape, generator=g, device=dev)
        slots = torch.tensor(ring_slots(a, f0, Fb), device=dev)
        filled = min(f0 + Fb, a.slots)
        rings = [Ring(layer, slots, filled) for layer in state["layers"]]
        cond = self._cond(state, f0)

        def model(lat: torch.Tensor, sigma: float) -> torch.Tensor:
            inp = lat if cond is None else torch.cat([lat, cond], dim=1)
            t = torch.full((Fb,), sigma * 1000.0, device=dev)
            return forward(a, self.m, inp, t, f0, rings.__getitem__, state["layers"], actions)

        sigmas = schedule(a.step_list, steps, a.timestep_shift)
        x0 = x
        for i, s in enumerate(sigmas):
            x0 = x - s * model(x, s)
            if i + 1 < len(sigmas):
                nxt = sigmas[i + 1]
                x = (1 - nxt) * x0 + nxt * torch.randn(shape, generator=g, device=dev)
        model(x0, 0.0)  # the clean pass: the caches hold the block's denoised frames
        state["block"] += 1
        return x0

    def _cond(self, state: dict, f0: int) -> torch.Tensor | None:
        """Matrix-Game-2's channel-concatenated conditioning: the image latent on frame 0, zero after."""
        if "image_cond" not in state:
            return None
        cond = torch.zeros(self.arch.frames_per_block, *state["image_cond"].shape, device=self.device)
        if f0 == 0:
            cond[0] = state["image_cond"]
        return cond

    @torch.no_grad()
    def decode(self, state: dict, carry: torch.Tensor) -> Output:
        """Owns `latents` and `vae`: keep the block's latents for a rebuild, decode them streaming."""
        a = self.arch
        end = state["block"] * a.frames_per_block  # denoise already counted this block
        start = end - a.frames_per_block
        H = state["latents"].shape[0]
        state["latents"].index_copy_(0, torch.arange(start, end, device=self.device) % H, carry)
        rgb = vae_mod.decode(self.m.vae, state["vae"], start, carry)
        return Output(frames=((rgb.float() + 1) * 127.5).round().clamp(0, 255).to(torch.uint8).cpu())
