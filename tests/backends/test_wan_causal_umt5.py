"""wan_causal's local UMT5 prompt embedder, through `transformers`, with a tiny random UMT5 encoder
and a word-level tokenizer built here and saved to a directory (no hub, no network): a prompt
embeds to exactly the encoder's output over its own tokens (the padding to the model's context is
cut off again and changes nothing), the backend's cross-attention cache comes from it, and a
missing directory is a typed configuration error."""

from __future__ import annotations

import msgspec
import pytest
import torch

from libs.checkpoint import trees_equal
from libs.errors import BadRequest, ConfigError
from libs.schemas.engine import SessionInit
from services.engine_host.backends.base import advance
from services.engine_host.backends.wan_causal import WanCausalBackend, WanCausalConfig
from services.engine_host.backends.wan_causal.embed import Umt5Embedder
from tests.backends.wan_helpers import T2V

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning", "ignore::UserWarning")

WORDS = ["a", "road", "through", "the", "forest", "at", "night", "river"]


@pytest.fixture(scope="module")
def umt5_dir(tmp_path_factory):
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast, UMT5Config, UMT5EncoderModel

    d = tmp_path_factory.mktemp("umt5")
    vocab = {w: i for i, w in enumerate(["<pad>", "</s>", "<unk>", *WORDS])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<unk>",
                            model_max_length=512).save_pretrained(d)
    torch.manual_seed(3)
    cfg = UMT5Config(vocab_size=len(vocab), d_model=T2V.a.text_dim, d_kv=8, d_ff=48, num_layers=2, num_heads=4,
                     relative_attention_num_buckets=8, relative_attention_max_distance=16, pad_token_id=0,
                     eos_token_id=1, decoder_start_token_id=0)
    UMT5EncoderModel(cfg).eval().save_pretrained(d)
    return d


def config(directory) -> WanCausalConfig:
    return msgspec.structs.replace(T2V, embedder="umt5", embedder_dir=str(directory))


def test_a_prompt_embeds_to_the_encoders_output_over_its_own_tokens(umt5_dir, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # belt and braces: the embedder loads local files only
    from transformers import UMT5EncoderModel

    emb = Umt5Embedder(str(umt5_dir), max_tokens=T2V.a.context_tokens)
    out = emb.embed("text", b"a road through the forest")
    assert out.shape == (6, T2V.a.text_dim)  # five words and </s>: the padding is cut off
    model = UMT5EncoderModel.from_pretrained(umt5_dir, local_files_only=True).eval()
    ids = torch.tensor([[3, 4, 5, 6, 7, 1]])
    with torch.no_grad():
        want = model(input_ids=ids).last_hidden_state[0]  # the same tokens with no padding at all
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(emb.embed("text", b"a river at night")[:4], out[:4])
    with pytest.raises(BadRequest):
        emb.embed("image", b"\0" * 12)


def test_the_backend_takes_its_cross_attention_cache_from_the_local_encoder(umt5_dir, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    b1, b2 = WanCausalBackend(config(umt5_dir)), WanCausalBackend(config(umt5_dir))
    road, river = SessionInit(prompt="a road"), SessionInit(prompt="a river at night")
    s1, s2 = b1.init_state(7, road), b2.init_state(7, road)
    assert trees_equal(s1, s2)  # the static leaves are a pure function of the prompt
    assert not torch.equal(s1["layers"][0]["cross_k"], b1.init_state(7, river)["layers"][0]["cross_k"])
    o1, o2 = advance(b1, s1, [], 1), advance(b2, s2, [], 1)
    assert torch.equal(o1.frames, o2.frames) and trees_equal(s1, s2)


def test_a_missing_encoder_is_a_typed_config_error(tmp_path):
    with pytest.raises(ConfigError, match="UMT5"):
        WanCausalBackend(config(tmp_path / "absent"))
    with pytest.raises(ConfigError, match="embedder_dir"):
        WanCausalBackend(msgspec.structs.replace(T2V, embedder="umt5"))
