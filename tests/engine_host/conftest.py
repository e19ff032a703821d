"""Engine tests run torch with one intra-op thread: stages already run on their own threads, and on a
shared 2-core CI machine an OpenMP team per thread oversubscribes the cores (blocks 20-60x slower)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
