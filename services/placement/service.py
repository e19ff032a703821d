"""The placement service process."""

from __future__ import annotations

from libs.config import BaseConfig
from libs.service import Service


class PlacementConfig(BaseConfig, kw_only=True):
    pass


class PlacementService(Service):
    name = "placement"
    config_type = PlacementConfig
