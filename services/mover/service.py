"""The mover service process."""

from __future__ import annotations

from libs.config import BaseConfig
from libs.service import Service


class MoverConfig(BaseConfig, kw_only=True):
    pass


class MoverService(Service):
    name = "mover"
    config_type = MoverConfig
