"""wan_causal's weights from a local directory in both layouts (sha256-checked, names and shapes
exact), its streamed VAE decoder (bit-exact to diffusers' full decode, rebuilt exactly from the
latent history after it wraps), and a host serving it only when its config names it."""

from __future__ import annotations

import msgspec
import pytest
import torch

from libs.errors import ConfigError
from services.engine_host.backends.wan_causal import WanCausalBackend, WanCausalConfig
from services.engine_host.backends.wan_causal import model as model_mod
from services.engine_host.backends.wan_causal import vae as vae_mod
from services.engine_host.backends.wan_causal.config import Arch
from services.engine_host.runtime import EngineRuntime
from tests.backends.wan_helpers import I2V, T2V

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning")

# diffusers' names back to the original Wan checkpoint's (the inverse of its converter)
TO_WAN = [("condition_embedder.time_embedder.linear_1", "time_embedding.0"),
          ("condition_embedder.time_embedder.linear_2", "time_embedding.2"),
          ("condition_embedder.text_embedder.linear_1", "text_embedding.0"),
          ("condition_embedder.text_embedder.linear_2", "text_embedding.2"),
          ("condition_embedder.time_proj", "time_projection.1"),
          ("condition_embedder.image_embedder.norm1", "img_emb.proj.0"),
          ("condition_embedder.image_embedder.ff.net.0.proj", "img_emb.proj.1"),
          ("condition_embedder.image_embedder.ff.net.2", "img_emb.proj.3"),
          ("condition_embedder.image_embedder.norm2", "img_emb.proj.4"),
          ("attn1", "self_attn"), ("attn2", "cross_attn"), (".to_out.0.", ".o."), (".to_q.", ".q."),
          (".to_k.", ".k."), (".to_v.", ".v."), ("ffn.net.0.proj", "ffn.0"), ("ffn.net.2", "ffn.2"),
          (".norm2.", ".norm3."), ("proj_out", "head.head")]


def wan_checkpoint(w: dict[str, torch.Tensor]) -> dict:
    """A training checkpoint as Self-Forcing / Matrix-Game-2 ship one: original names, `model.` prefixes,
    the action modules inside their blocks, nested under `generator_ema`."""
    out = {}
    for k, v in w.items():
        top, _, name = k.partition(".")
        if top == "actions":
            block, _, rest = name.partition(".")
            out[f"model.blocks.{block}.action_model.{rest}"] = v
        elif top == "transformer":
            for new, old in TO_WAN:
                name = name.replace(new, old)
            name = "head.modulation" if name == "scale_shift_table" else name.replace("scale_shift_table", "modulation")
            out[f"model.{name}"] = v
    return {"generator_ema": out}


def test_weights_load_from_a_local_directory_in_both_layouts_and_a_wrong_digest_is_refused(tmp_path):
    for cfg, layout_name in ((T2V, "diffusers"), (I2V, "wan")):
        random = WanCausalBackend(cfg)
        w = random.m.state_dict()
        d = tmp_path / layout_name
        d.mkdir()
        digests = model_mod.save_diffusers({k: v for k, v in w.items() if k.startswith("vae.")}
                                           if layout_name == "wan" else w, d)
        if layout_name == "wan":
            torch.save(wan_checkpoint(w), d / "transformer.pt")
            digests["transformer.pt"] = model_mod.weights_mod.sha256_of(d / "transformer.pt")
        local = msgspec.structs.replace(cfg, random_weights=False, weights_dir=str(d), weights_layout=layout_name,
                                        weights_sha256=digests)
        loaded = WanCausalBackend(local).m.state_dict()
        assert set(loaded) == set(w) and all(torch.equal(loaded[k], w[k]) for k in w), layout_name
        wrong = dict(digests) | {next(iter(digests)): "0" * 64}
        with pytest.raises(ConfigError, match="sha256"):
            WanCausalBackend(msgspec.structs.replace(local, weights_sha256=wrong))
        with pytest.raises(ConfigError, match="digest"):
            WanCausalBackend(msgspec.structs.replace(local, weights_sha256={}))
    with pytest.raises(ConfigError, match="lack|unexpected|needs"):  # a checkpoint of another shape
        WanCausalBackend(msgspec.structs.replace(local, arch=msgspec.structs.replace(I2V.a, ffn_dim=64)))


def _vae(a: Arch):
    vae = vae_mod.build(a, "cpu").eval().requires_grad_(False)
    g = torch.Generator().manual_seed(4)
    for p in vae.parameters():
        p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return vae


@pytest.mark.timeout(900)  # 75 latent frames through the decoder: seconds on a quiet machine, minutes on a loaded one
@torch.no_grad()
def test_the_streamed_decoder_equals_a_full_decode_bit_for_bit_and_rebuilds_exactly_after_wrapping():
    a = Arch(latent_h=2, latent_w=2)  # 3-frame blocks, the Wan decoder's layout at the smallest size
    vae = _vae(a)
    g = torch.Generator().manual_seed(5)
    H = vae_mod.history_frames(a)
    blocks = H // a.frames_per_block + 1  # the latent history has wrapped
    z = torch.randn(blocks * 3, a.out_channels, a.latent_h, a.latent_w, generator=g)
    leaves = [torch.zeros(s) for s in vae_mod.cache_shapes(a)]
    ring = torch.zeros(H, *z.shape[1:])
    streamed = []
    for b in range(blocks):
        part = z[3 * b: 3 * b + 3]
        ring.index_copy_(0, torch.arange(3 * b, 3 * b + 3) % H, part)
        streamed.append(vae_mod.decode(vae, leaves, 3 * b, part))
        if b == 1:  # bit for bit against diffusers' own decode of the same frames
            mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1)
            std = torch.tensor(vae.config.latents_std).view(1, -1, 1, 1)
            full = vae.decode((z[:6] * std + mean).permute(1, 0, 2, 3)[None]).sample.clamp(-1, 1)
            assert torch.equal(torch.cat(streamed), full[0].permute(1, 0, 2, 3))
    ptrs = [t.data_ptr() for t in leaves]
    rebuilt = [torch.full_like(t, 7.0) for t in leaves]
    vae_mod.rebuild(vae, a, rebuilt, ring, blocks)
    assert all(torch.equal(x, y) for x, y in zip(rebuilt, leaves, strict=True))
    assert ptrs == [t.data_ptr() for t in leaves]


def test_a_host_serves_wan_causal_only_when_its_config_names_it():
    assert "wan_causal" not in EngineRuntime("cpu", host_id="h").served_backends()
    named = EngineRuntime("cpu", host_id="h", backend_configs={"wan_causal": msgspec.msgpack.encode(T2V)})
    assert "wan_causal" in named.served_backends() and "dit" in named.served_backends()


def test_backend_configs_come_inline_or_from_a_toml_file(tmp_path):
    from libs import config as configmod
    from services.engine_host.service import EngineHostConfig, backend_tables

    path = tmp_path / "backends.toml"
    path.write_text('[wan_causal]\npreset = "matrix_game_2"\nweights_dir = "/models/mg2"\n')
    cfg = configmod.load(EngineHostConfig, None, {"SF_BACKEND_CONFIGS": str(path)})
    tables = backend_tables(cfg.backend_configs)
    assert tables == {"wan_causal": {"preset": "matrix_game_2", "weights_dir": "/models/mg2"}}
    assert msgspec.convert(tables["wan_causal"], WanCausalConfig).preset == "matrix_game_2"
    assert backend_tables({"dit": {"fps": 10.0}}) == {"dit": {"fps": 10.0}}
    path.write_text("preset = 3\n")
    with pytest.raises(ConfigError, match="table"):
        backend_tables(str(path))
