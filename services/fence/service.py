"""The fence service process."""

from __future__ import annotations

from libs.config import BaseConfig
from libs.service import Service


class FenceConfig(BaseConfig, kw_only=True):
    pass


class FenceService(Service):
    name = "fence"
    config_type = FenceConfig
