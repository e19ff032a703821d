"""A test backend: the `avatar` model whose denoise stage takes `slow_s` longer, between the stage's
writes to the state and the decode's (so a reader that does not wait for the block sees it
half-written). `slow_s` comes from the host's environment (`SF_TEST_STAGE_SLOW_S`, seconds), or, where
`SF_TEST_STAGE_SLOW_FILE` names a file, from that file at every block (absent: 0), so a test can switch a
running host's stage time up after it has profiled itself. While `<that file>.hold` exists, a block that
finished its stage time stays in the stage (it leaves `<that file>.held` behind, so the test knows one is
in flight) until the test removes it: a block held for as long as the test needs, whatever the load. A
test makes one host slow and another not: the tier, batch and skip decisions a slow host takes differ
from a fast one's, and the block journal must carry them. The bytes a block produces do not depend on it."""

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
        if slow_s := self._slow_s():
            time.sleep(slow_s)
        if self.slow_file is not None:
            _held(self.slow_file)
        return out

    def _slow_s(self) -> float:
        if self.slow_file is None:
            return self.slow_s
        try:
            return float(self.slow_file.read_text())
        except (OSError, ValueError):
            return 0.0


def _held(slow_file: Path) -> None:
    hold = slow_file.with_name(slow_file.name + ".hold")
    while hold.exists():
        slow_file.with_name(slow_file.name + ".held").touch()
        time.sleep(0.05)


SOURCES = {"slow_avatar": f"{__name__}:SlowAvatar"}
