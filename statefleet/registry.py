"""Service name → its Service class. The only place that imports services by name."""

from __future__ import annotations

import importlib

from libs.service import Service

SERVICES: dict[str, str] = {
    "fence": "services.fence.service:FenceService",
    "admission": "services.admission.service:AdmissionService",
    "placement": "services.placement.service:PlacementService",
    "mover": "services.mover.service:MoverService",
    "engine_host": "services.engine_host.service:EngineHostService",
}


def service_type(name: str) -> type[Service]:
    module, cls = SERVICES[name].split(":")
    return getattr(importlib.import_module(module), cls)
