"""A device's capacity as measured under co-location: the one record admission, placement, the
fleet controller and the simulator read what a device carries from (`libs/capacity_model.py`)."""

from __future__ import annotations

from libs.schemas.base import Msg


class CurvePoint(Msg):
    """At `sessions` sessions co-located on the device, one block of this kind takes `chunk_ms` of the
    device's wall time, amortised: the time `sessions` blocks take together, over `sessions`."""

    sessions: int
    chunk_ms: float
    block_ms: float = 0.0  # one block's own time through its stages at this concurrency (its latency)
    blocks: int = 0  # how many blocks this point was measured from (start-up and serving together)


class Curve(Msg):
    """Chunk time against concurrency for one (backend, config, tier) on one device."""

    backend: str
    shape: str  # backend and config (`costs.shape_of`): sessions of another config are another kind
    tier: int
    points: list[CurvePoint] = []  # ascending in `sessions`: what capacity reads (start-up, refreshed)
    startup: list[CurvePoint] = []  # as measured at start-up: serving scales these by the slowdown it sees


class Kind(Msg):
    """How many sessions of one kind a host holds (or a reservation adds): what their load is priced by."""

    backend: str
    tier: int  # the tier it is budgeted at (its floor)
    window_ms: float = 0.0  # its period or deadline; 0: no window (runs in the slack, costs no share)
    blocks_per_window: int = 1
    count: int = 1


class DeviceCapacity(Msg):
    """One device's measured capacity (KV `sf_device_capacity`, one key per device). Hosts that share
    the device measure once, together: the first takes the key (`state="measuring"` until `until`),
    the others wait and adopt the result; serving then refreshes the points at the concurrency it ran.
    Every host on the device writes it only by compare-and-set on its revision."""

    device: str  # `contracts.device_key`: machine and device
    state: str = "measured"  # measuring | measured
    measured_by: str = ""  # host id
    until: float = 0.0  # while measuring: another host takes over after this (wall clock)
    updated_at: float = 0.0
    slots: int = 0  # the most sessions a host of this device holds: the curve's last point
    hosts: list[str] = []  # host ids that run on this device (each adds itself)
    curves: list[Curve] = []
    rows: list[ProfileRow] = []  # the start-up profile the measuring host took; its peers adopt it


# common.py's EngineEntry carries this record: imported last, so either module may be imported first.
from libs.schemas.common import ProfileRow  # noqa: E402
