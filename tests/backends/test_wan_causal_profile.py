"""The start-up profile needs no user input (issue 25): a host serving wan_causal from precomputed
embeddings that hold none for any placeholder prompt, or an image-to-video config with no image at
start-up, still profiles and starts; the profile's scratch session has a real session's layout."""

from __future__ import annotations

import msgspec
import pytest
import torch
from safetensors.torch import save_file

from libs import bus, names
from libs.checkpoint import tree_bytes
from libs.errors import BadRequest
from libs.schemas.engine import OpenSession, SessionInfo, SessionInit
from services.engine_host import profile
from services.engine_host.backends import spec as specs
from services.engine_host.backends import weights as weights_mod
from services.engine_host.backends.wan_causal import WanCausalBackend, WanCausalConfig
from services.engine_host.backends.wan_causal.embed import embedding_key
from services.engine_host.service import EngineHostConfig, EngineHostService
from tests.backends.wan_helpers import I2V, IMAGE, ROAD, T2V

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning")


def file_config(tmp_path, base: WanCausalConfig, kind: str, data: bytes, tokens: int) -> WanCausalConfig:
    """`base` with precomputed embeddings holding one entry only: `kind`/`data`, `tokens` long."""
    a = base.a
    path = tmp_path / "embeddings.safetensors"
    save_file({embedding_key(kind, data): torch.randn(tokens, a.image_dim or a.text_dim)}, str(path))
    return msgspec.structs.replace(base, embedder="file", embeddings_path=str(path),
                                   embeddings_sha256=weights_mod.sha256_of(str(path)))


def test_profiling_a_file_embedder_lacking_the_placeholder_prompt_succeeds(tmp_path):
    b = WanCausalBackend(file_config(tmp_path, T2V, "text", ROAD.prompt.encode(), tokens=3))
    with pytest.raises(BadRequest, match="no precomputed text embedding"):
        b.init_state(0, SessionInit(prompt="profile"))  # what the profile opened before
    rows = profile.measure(b, blocks=1, warmup=1)
    real = b.init_state(0, ROAD)
    assert [r.tier for r in rows] == list(b.tiers)
    assert all(r.state_bytes == tree_bytes(real) and r.moved_bytes == tree_bytes(specs.select(real, b.state_spec()))
               for r in rows)
    assert all(r.quantum_ms > 0 and r.block_ms >= r.quantum_ms for r in rows)


def test_profiling_an_image_to_video_config_needs_no_image():
    b = WanCausalBackend(I2V)
    with pytest.raises(BadRequest, match="starts from an image"):
        b.init_state(0, SessionInit(prompt="profile"))
    scratch = b.profile_state(0)
    real = b.init_state(0, IMAGE)
    specs.LeafSnapshot.take(scratch, b.state_spec())  # the scratch tree has the spec's layout
    assert tree_bytes(scratch) == tree_bytes(real)
    rows = profile.measure(b, blocks=1, warmup=1)
    assert [r.tier for r in rows] == list(b.tiers) and all(r.rebuild_ms > 0 for r in rows)


@pytest.mark.timeout(900)
async def test_a_host_serving_image_to_video_from_precomputed_embeddings_starts_and_serves(nats_server, tmp_path):
    """Both at once, as `statefleet up` would: a file embedder holding only the user's image."""
    config = file_config(tmp_path, I2V, "image", IMAGE.image.rgb, tokens=I2V.a.context_tokens)
    host = EngineHostService(EngineHostConfig(
        nats_url=nats_server.url, log_json=False, heartbeat_s=0.5, host_id="w1", profile_blocks=1,
        torch_threads=1, backend_configs={"wan_causal": msgspec.to_builtins(config)}))
    await host.start()
    nc = await bus.connect(nats_server.url, name="test")
    try:
        assert {r.backend for r in host.profile} >= {"wan_causal"}
        info = await bus.request(nc, names.engine_subject("w1", "open"),
                                 OpenSession(session_id="wi", backend="wan_causal", seed=3, image=IMAGE.image),
                                 SessionInfo, timeout_s=120)
        assert info.state == "running"
    finally:
        await nc.close()
        await host.stop()
