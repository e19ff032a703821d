"""Cross-attention inputs: what a prompt (or Matrix-Game-2's init image) embeds to, behind one interface.

- `FileEmbeddings` (default): precomputed embeddings in a local safetensors file, sha256-checked,
  keyed `text/<sha256 of the prompt's UTF-8>` ([tokens ≤ 512, 4096] for UMT5-XXL) and
  `image/<sha256 of the RGB bytes>` ([257, 1280] for CLIP ViT-H/14); `embedding_key` names them.
- `Umt5Embedder`: a UMT5 encoder and its tokenizer run locally through `transformers` from
  `embedder_dir` (never a download: `local_files_only`), as Wan's own text encoder: the prompt
  padded to the model's context tokens (512), the padding cut off again.
- `RandomEmbeddings`: a fixed function of the key, for benchmarks and tests (named so in the config).
A session whose prompt or image has no embedding is refused with a typed error at open.
"""

from __future__ import annotations

import hashlib
from typing import Protocol

import torch

from libs.errors import BadRequest, ConfigError
from services.engine_host.backends import weights as weights_mod
from services.engine_host.backends.wan_causal.config import WanCausalConfig


def embedding_key(kind: str, data: bytes) -> str:
    return f"{kind}/{hashlib.sha256(data).hexdigest()}"


class Embedder(Protocol):
    def embed(self, kind: str, data: bytes) -> torch.Tensor:
        """[tokens, width] for a prompt's UTF-8 (`text`) or an image's RGB bytes (`image`)."""
        ...


class FileEmbeddings:
    def __init__(self, path: str, sha256: str) -> None:
        from safetensors.torch import load_file

        if not path:
            raise ConfigError("wan_causal: embedder 'file' needs embeddings_path (precomputed embeddings)")
        if not sha256 or weights_mod.sha256_of(path) != sha256.lower():
            raise ConfigError(f"wan_causal: embeddings {path} do not match embeddings_sha256", path=path)
        self.path, self.table = path, load_file(path)

    def embed(self, kind: str, data: bytes) -> torch.Tensor:
        key = embedding_key(kind, data)
        if key not in self.table:
            raise BadRequest(f"no precomputed {kind} embedding {key} in {self.path}", key=key)
        return self.table[key].float()


class RandomEmbeddings:
    def __init__(self, widths: dict[str, tuple[int, int]]) -> None:
        self.widths = widths  # kind -> (tokens, width)

    def embed(self, kind: str, data: bytes) -> torch.Tensor:
        tokens, width = self.widths[kind]
        seed = int.from_bytes(hashlib.sha256(kind.encode() + data).digest()[:8], "little") % (2**63 - 1)
        return torch.randn(tokens, width, generator=torch.Generator().manual_seed(seed))


class Umt5Embedder:
    def __init__(self, directory: str, max_tokens: int) -> None:
        try:
            from transformers import AutoTokenizer, UMT5EncoderModel
        except ImportError:
            raise ConfigError("wan_causal: embedder 'umt5' needs transformers: pip install 'statefleet[wan]'") from None
        if not directory:
            raise ConfigError("wan_causal: embedder 'umt5' needs embedder_dir (a local UMT5 encoder)")
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
            self.model = UMT5EncoderModel.from_pretrained(directory, local_files_only=True).eval()
        except (OSError, ValueError) as e:
            raise ConfigError(f"wan_causal: no UMT5 encoder and tokenizer in {directory}: {e}", path=directory) from None
        self.max_tokens = max_tokens

    @torch.no_grad()
    def embed(self, kind: str, data: bytes) -> torch.Tensor:
        if kind != "text":
            raise BadRequest("the UMT5 embedder embeds prompts, not images")
        ids = self.tokenizer([data.decode()], padding="max_length", max_length=self.max_tokens, truncation=True,
                             add_special_tokens=True, return_tensors="pt")
        out = self.model(input_ids=ids.input_ids, attention_mask=ids.attention_mask).last_hidden_state[0]
        return out[: int(ids.attention_mask.sum())].float()


def make(c: WanCausalConfig) -> Embedder:
    a = c.a
    if c.embedder == "random":
        return RandomEmbeddings({"text": (a.context_tokens, max(a.text_dim, 1)), "image": (a.context_tokens,
                                                                                       max(a.image_dim, 1))})
    if c.embedder == "umt5":
        return Umt5Embedder(c.embedder_dir, a.context_tokens)
    return FileEmbeddings(c.embeddings_path, c.embeddings_sha256)
