"""The modules: diffusers' `WanTransformer3DModel` and `AutoencoderKLWan` as they are, the
Matrix-Game-2 action modules beside them, and their weights: random from a fixed seed (benchmarks
and tests, named so in the config) or read from a local directory, every file sha256-checked.

Directory layouts (`weights_layout`):
- `diffusers`: `transformer/diffusion_pytorch_model.safetensors`, `vae/diffusion_pytorch_model.safetensors`
  and, for Matrix-Game-2, `action/diffusion_pytorch_model.safetensors` (keys `<block>.<param>`);
- `wan`: the original checkpoint, `transformer.pt` (or `transformer.safetensors`; a training
  checkpoint's `generator_ema` / `generator` / `state_dict` entry is taken; `model.` prefixes are
  stripped; `blocks.N.action_model.*` are the action modules), mapped onto diffusers' names by
  diffusers' own `convert_wan_transformer_to_diffusers`, and the VAE as `Wan2.1_VAE.pth` (through
  `convert_wan_vae_to_diffusers`) or in the diffusers layout above.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from torch import nn

from libs.errors import ConfigError
from services.engine_host.backends import weights as weights_mod
from services.engine_host.backends.base import WEIGHT_SEED
from services.engine_host.backends.wan_causal import vae as vae_mod
from services.engine_host.backends.wan_causal.action import ActionModule
from services.engine_host.backends.wan_causal.config import Arch, WanCausalConfig

Weights = dict[str, torch.Tensor]
FP32_PARTS = ("condition_embedder.time_embedder", "scale_shift_table")  # kept in float32, as diffusers does


class WanCausalModel(nn.Module):
    def __init__(self, a: Arch) -> None:
        super().__init__()
        from diffusers import WanTransformer3DModel

        self.transformer = WanTransformer3DModel(
            patch_size=(1, 2, 2), num_attention_heads=a.heads, attention_head_dim=a.head_dim,
            in_channels=a.in_channels, out_channels=a.out_channels, text_dim=max(a.text_dim, 1), freq_dim=a.freq_dim,
            ffn_dim=a.ffn_dim, num_layers=a.layers, cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6,
            image_dim=a.image_dim or None, added_kv_proj_dim=None)
        if not a.text_dim:  # Matrix-Game-2 cross-attends to the image alone
            del self.transformer.condition_embedder.text_embedder  # type: ignore[attr-defined]  # unannotated in diffusers
        self.actions = nn.ModuleDict({str(i): ActionModule(a) for i in a.action_blocks})
        self.vae = vae_mod.build(a, torch.get_default_device())


def build(a: Arch) -> WanCausalModel:
    """The model on the meta device: names and shapes, nothing allocated."""
    with torch.device("meta"):
        return WanCausalModel(a)


def expected(a: Arch) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in build(a).state_dict().items()}


def random_weights(a: Arch, dtype: torch.dtype, device: torch.device) -> Weights:
    """A fixed function of the architecture: unit norms, zero biases, fan-in-scaled matrices."""
    g = torch.Generator().manual_seed(WEIGHT_SEED + 25)
    out = {}
    for name, shape in sorted(expected(a).items()):
        if name.endswith("bias"):
            t = torch.zeros(shape)
        elif len(shape) == 1:
            t = torch.ones(shape)
        elif name.endswith("scale_shift_table"):
            t = torch.randn(shape, generator=g) / shape[-1] ** 0.5
        else:
            t = torch.randn(shape, generator=g) * math.prod(shape[1:]) ** -0.5
        out[name] = t
    return cast(out, dtype, device)


def cast(w: Weights, dtype: torch.dtype, device: torch.device) -> Weights:
    return {k: v.to(device=device, dtype=torch.float32 if any(p in k for p in FP32_PARTS) else dtype).contiguous()
            for k, v in w.items()}


def _checked(c: WanCausalConfig, rel: str) -> Path:
    path = Path(c.weights_dir) / rel
    want = c.weights_sha256.get(rel, "")
    if not want:
        raise ConfigError(f"wan_causal: weights_sha256 names no digest for {rel} (every file read from "
                          f"weights_dir needs one)", path=str(path))
    try:
        digest = weights_mod.sha256_of(path)
    except OSError as e:
        raise ConfigError(f"wan_causal weights {path} do not open: {e}", path=str(path)) from None
    if digest != want.lower():
        raise ConfigError(f"wan_causal weights {path} have sha256 {digest}, the config says {want}", path=str(path))
    return path


def _read(path: Path) -> Weights:
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    obj = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    for key in ("generator_ema", "generator", "state_dict"):  # training checkpoints nest the model
        if isinstance(obj, dict) and isinstance(obj.get(key), dict):
            obj = obj[key]
            break
    return {k.removeprefix("model."): v for k, v in obj.items()}


def _first(c: WanCausalConfig, *names: str) -> str:
    for rel in names:
        if (Path(c.weights_dir) / rel).exists():
            return rel
    raise ConfigError(f"wan_causal: {c.weights_dir} holds none of {list(names)}", path=c.weights_dir)


def load_dir(c: WanCausalConfig, dtype: torch.dtype, device: torch.device) -> Weights:
    """The model's weights from `weights_dir` in its layout, refused unless every file's sha256 is the
    config's and the names and shapes are exactly the model's."""
    from diffusers.loaders.single_file_utils import (
        convert_wan_transformer_to_diffusers,
        convert_wan_vae_to_diffusers,
    )

    a = c.a
    out: dict[str, torch.Tensor] = {}
    vae_rel = "vae/diffusion_pytorch_model.safetensors"
    if c.weights_layout == "diffusers":
        out |= {f"transformer.{k}": v for k, v in _read(_checked(c, "transformer/diffusion_pytorch_model.safetensors")).items()}
        if a.action_blocks:
            out |= {f"actions.{k}": v for k, v in _read(_checked(c, "action/diffusion_pytorch_model.safetensors")).items()}
    else:
        raw = _read(_checked(c, _first(c, "transformer.pt", "transformer.safetensors")))
        for k in [k for k in raw if ".action_model." in k]:
            block, _, rest = k.removeprefix("blocks.").partition(".action_model.")
            out[f"actions.{block}.{rest}"] = raw.pop(k)
        out |= {f"transformer.{k}": v for k, v in convert_wan_transformer_to_diffusers(raw).items()}
        vae_rel = _first(c, "Wan2.1_VAE.pth", vae_rel)
    vae = _read(_checked(c, vae_rel))
    if vae_rel.endswith(".pth"):
        vae = convert_wan_vae_to_diffusers(vae)
    out |= {f"vae.{k}": v for k, v in vae.items()}
    want = expected(a)
    if set(out) != set(want):
        missing, extra = sorted(set(want) - set(out)), sorted(set(out) - set(want))
        raise ConfigError(f"wan_causal weights in {c.weights_dir} lack {missing[:5]} or have unexpected {extra[:5]}",
                          path=c.weights_dir)
    for name, shape in want.items():
        if tuple(out[name].shape) != shape:
            raise ConfigError(f"wan_causal weight {name} is {list(out[name].shape)}, the model needs {list(shape)}",
                              path=c.weights_dir, weight=name)
    return cast(out, dtype, device)


def instantiate(a: Arch, w: Weights) -> WanCausalModel:
    """A module over the shared tensors (no copy): one per backend instance, the weights one per host."""
    m = build(a)
    m.load_state_dict(w, strict=True, assign=True)
    return m.eval().requires_grad_(False)


def save_diffusers(w: Weights, directory: Path) -> dict[str, str]:
    """Write weights in the diffusers layout; returns {relative path: sha256} (what a config names)."""
    from safetensors.torch import save_file

    parts: dict[str, Weights] = {}
    for k, v in w.items():
        top, _, rest = k.partition(".")
        parts.setdefault({"transformer": "transformer", "vae": "vae", "actions": "action"}[top], {})[rest] = v
    digests = {}
    for folder, tensors in parts.items():
        rel = f"{folder}/diffusion_pytorch_model.safetensors"
        (directory / folder).mkdir(parents=True, exist_ok=True)
        save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, str(directory / rel))
        digests[rel] = weights_mod.sha256_of(directory / rel)
    return digests
