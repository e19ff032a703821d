"""Shared by the wan_causal tests: tiny configs (random weights and embeddings, named so) and the
full-sequence reference the streamed blocks are checked against."""

from __future__ import annotations

import json

import torch

from libs.schemas.common import InputItem
from libs.schemas.engine import RawImage, SessionInit
from services.engine_host.backends.wan_causal import PRESETS, Arch, WanCausalConfig

RANDOM = {"random_weights": True, "embedder": "random"}
# 2-frame blocks, a 1-frame sink and a 4-frame window: the ring wraps from the third block on
T2V = WanCausalConfig(arch=Arch(frames_per_block=2, sink_frames=1, window_frames=4), **RANDOM)
I2V = WanCausalConfig(arch=Arch(**{f: getattr(PRESETS["tiny_i2v_actions"], f) for f in Arch.__struct_fields__}
                                | {"frames_per_block": 2, "window_frames": 4}), **RANDOM)
IMAGE = SessionInit(image=RawImage(width=8, height=6, rgb=bytes(range(144))))
ROAD = SessionInit(prompt="a road")


def act(keys, mouse=(0, 0), seq=1) -> InputItem:
    return InputItem(session_id="s", seq=seq, kind="action",
                     data=json.dumps({"keys": keys, "mouse": list(mouse)}).encode())


class FullMask:
    """The whole sequence at once under the block-causal sliding-window mask: a query frame sees
    its own block and every frame before it that is in the sink or the last `window` frames."""

    def __init__(self, a: Arch, frames: int) -> None:
        q, j = torch.arange(frames)[:, None], torch.arange(frames)[None]
        end = (q // a.frames_per_block + 1) * a.frames_per_block
        self.mask = (j < end) & ((j < a.sink_frames) | (j >= end - a.window_frames))

    def __call__(self, name: str, k: torch.Tensor, v: torch.Tensor):
        return k, v, self.mask
