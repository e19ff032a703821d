"""The staging pool's default size: warm memory for moves on CPU hosts, nothing pinned on GPU hosts."""

import torch

from libs.config import load
from services.engine_host.service import EngineHostConfig, staging_bytes


def test_a_cpu_host_gets_a_pool_and_a_gpu_host_none_unless_configured():
    unset = load(EngineHostConfig, env={}).staging_pool_bytes
    assert staging_bytes(unset, torch.device("cpu")) == 64 << 20
    # device slots live in device memory; pinning a pool would also open a context on GPU 0 in every host
    assert staging_bytes(unset, torch.device("cuda:3")) == 0
    assert staging_bytes(load(EngineHostConfig, env={"SF_STAGING_POOL_BYTES": "0"}).staging_pool_bytes,
                         torch.device("cpu")) == 0
    assert staging_bytes(1 << 30, torch.device("cuda:0")) == 1 << 30
