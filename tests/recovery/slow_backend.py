"""A test backend: the `avatar` model whose denoise stage takes `slow_s` longer, between the stage's
writes to the state and the decode's (so a reader that does not wait for the block sees it
half-written). `slow_s` comes from the host's environment (`SF_TEST_STAGE_SLOW_S`, seconds), or, where
`SF_TEST_STAGE_SLOW_FILE` names a file, from that file, read again while the stage waits (absent: 0), so a
test can switch a running host's stage time up after it has profiled itself, or hold a block in its stage
(a large value) and let it go (0); a block waiting there leaves `<file>.in_stage` behind, so the test knows
one is in flight. A test makes one host slow and another not:
the tier, batch and skip decisions a slow host takes differ from a fast one's, and the block journal
must carry them. The bytes a block produces do not depend on it."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import ClassVar

import torch

from services.engine_host.backends.avatar import AvatarBackend, AvatarConfig


class SlowAvatar(AvatarBackend):
    name: ClassVar[str] = "slow_avatar"
    config_type: ClassVar[type] = AvatarConfig

    def __init__(self, config: AvatarConfig | None = None, device: torch.device | str = "cpu") -> None:
        super().__init__(config, device)
        self.slow_s = float(os.environ.get("SF_TEST_STAGE_SLOW_S", "0"))
        self.slow_file = Path(os.environ["SF_TEST_STAGE_SLOW_FILE"]) if os.environ.get("SF_TEST_STAGE_SLOW_FILE") else None

    def denoise_batch(self, states: list[dict], carries: list[torch.Tensor], steps: int) -> list[torch.Tensor]:
        out = super().denoise_batch(states, carries, steps)
        started = time.monotonic()
        while (left := self._slow_s() - (time.monotonic() - started)) > 0:
            if self.slow_file is not None:
                self.slow_file.with_name(self.slow_file.name + ".in_stage").touch()
            time.sleep(min(left, 0.05))
        return out

    def _slow_s(self) -> float:
        if self.slow_file is None:
            return self.slow_s
        try:
            return float(self.slow_file.read_text())
        except (OSError, ValueError):
            return 0.0


SOURCES = {"slow_avatar": f"{__name__}:SlowAvatar"}
