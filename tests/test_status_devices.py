"""`statefleet status` says when a device carries more than admission's limit, whatever the model's
prices say: hosts that share a device add up, hosts on other devices do not."""

from __future__ import annotations

from libs.schemas.common import EngineEntry
from statefleet.status import device_loads


def entry(host_id: str, machine: str, *, admitted: float, measured: float) -> EngineEntry:
    return EngineEntry(host_id=host_id, device="cpu", machine=machine, memory_bytes=1, free_memory_bytes=1,
                       busy_fraction=admitted, measured_fraction=measured)


def test_hosts_sharing_a_device_are_one_row_and_its_measured_overload_is_said():
    rows = device_loads([entry("e0", "m1", admitted=0.4, measured=0.55), entry("e1", "m1", admitted=0.3, measured=0.5),
                         entry("e2", "m2", admitted=0.8, measured=0.6)], limit=0.9)
    by = {r["device"]: r for r in rows}
    assert set(by) == {"m1/cpu", "m2/cpu"}
    shared = by["m1/cpu"]
    assert shared["hosts"] == ["e0", "e1"]
    assert abs(shared["admitted"] - 0.7) < 1e-9 and abs(shared["measured"] - 1.05) < 1e-9
    assert shared["over_capacity"]  # admitted within the limit, but the device ran past it
    assert not by["m2/cpu"]["over_capacity"]
