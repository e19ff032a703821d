"""The admission service process."""

from __future__ import annotations

from libs.config import BaseConfig
from libs.service import Service


class AdmissionConfig(BaseConfig, kw_only=True):
    pass


class AdmissionService(Service):
    name = "admission"
    config_type = AdmissionConfig
