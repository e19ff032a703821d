"""The engine host process: one per device, announces itself and heartbeats capacity."""

from __future__ import annotations

import os
import socket
import time

import torch

from libs import bus, names
from libs.config import BaseConfig
from libs.schemas.base import encode
from libs.schemas.common import EngineEntry
from libs.service import VERSION, Service


class EngineHostConfig(BaseConfig, kw_only=True):
    host_id: str = ""
    device: str = "cpu"


def device_memory(device: torch.device) -> tuple[int, int]:
    """(total, free) bytes of the device's memory; host RAM for `cpu`."""
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        return total, free
    page = os.sysconf("SC_PAGE_SIZE")
    return os.sysconf("SC_PHYS_PAGES") * page, os.sysconf("SC_AVPHYS_PAGES") * page


class EngineHostService(Service):
    name = "engine_host"
    config_type = EngineHostConfig

    def __init__(self, config: EngineHostConfig) -> None:
        config.instance_id = config.instance_id or config.host_id or f"{socket.gethostname()}-{config.device}"
        super().__init__(config)
        self.host_id = config.host_id or self.instance
        self.device = torch.device(config.device)

    @property
    def ping_subject(self) -> str:
        return names.engine_subject(self.host_id, "ping")

    @property
    def ping_queue(self) -> str:
        return ""

    async def setup(self) -> None:
        ttl = self.config.heartbeat_s * names.HEARTBEAT_TTL_FACTOR
        self.engines_kv = await bus.ensure_kv(self.js, names.ENGINES_BUCKET, ttl_s=ttl,
                                              replicas=self.config.nats_replicas)

    async def heartbeat(self) -> None:
        total, free = device_memory(self.device)
        entry = EngineEntry(host_id=self.host_id, device=str(self.device), memory_bytes=total,
                            free_memory_bytes=free, version=VERSION, heartbeat_at=time.time())
        await self.engines_kv.put(self.host_id, encode(entry))

    async def teardown(self) -> None:
        try:
            await self.engines_kv.delete(self.host_id)
        except Exception as e:
            self.log.warning("engine_entry_delete_failed", error=str(e))
