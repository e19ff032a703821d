"""A test backend: the `avatar` model whose denoise stage takes `slow_s` longer, between the stage's
writes to the state and the decode's (so a reader that does not wait for the block sees it
half-written). `slow_s` comes from the host's environment (`SF_TEST_STAGE_SLOW_S`, seconds), so a
test makes one host slow and another not: the tier, batch and skip decisions a slow host takes
differ from a fast one's, and the block journal must carry them. The bytes a block produces do not
depend on it."""

from __future__ import annotations

import os
import time
from typing import ClassVar

import torch

from services.engine_host.backends.avatar import AvatarBackend, AvatarConfig


class SlowAvatar(AvatarBackend):
    name: ClassVar[str] = "slow_avatar"
    config_type: ClassVar[type] = AvatarConfig

    def __init__(self, config: AvatarConfig | None = None, device: torch.device | str = "cpu") -> None:
        super().__init__(config, device)
        self.slow_s = float(os.environ.get("SF_TEST_STAGE_SLOW_S", "0"))

    def denoise_batch(self, states: list[dict], carries: list[torch.Tensor], steps: int) -> list[torch.Tensor]:
        out = super().denoise_batch(states, carries, steps)
        if self.slow_s:
            time.sleep(self.slow_s)
        return out


SOURCES = {"slow_avatar": f"{__name__}:SlowAvatar"}
