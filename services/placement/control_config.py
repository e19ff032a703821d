"""The fleet controller's settings (rebalancing, autoscaling, idle offload), part of `PlacementConfig`.

Every field is an `SF_<FIELD>` environment variable too. The pure policies' knobs are declared once,
in `policy.Knobs` (services/placement/policy/params.py), and taken here field by field under their
own names (`with_section`): the service, the simulator and the tests start from the same defaults.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from libs.config import BaseConfig, PositiveFloat, section, with_section
from libs.contracts import Guard
from services.placement.policy.params import Knobs, Params


@with_section(Knobs)
class FleetControlConfig(BaseConfig, kw_only=True):
    # The controller runs in one placement instance at a time (a tenure in `sf_placement_lease`).
    fleet_control: bool = True
    control_s: PositiveFloat = 1.0  # one decision (snapshot, decide, apply) this often
    tenure_ttl_s: PositiveFloat = 6.0
    rebalance: bool = True  # the rebalancing policy runs (its knobs are in `Knobs`)
    # Shed load from a device measured past its limit (`policy/overload.py`: move, suspend C3/C2, then a
    # C1 as `capacity_lost`, re-queued until a device has room); resumes read the measured load too, so a
    # shed session does not go back to a device still past its limit (docs/decisions.md, issue 23).
    relieve_overload: bool = True
    path_bps: PositiveFloat = 1e9  # data-plane rate assumed between two hosts (bytes/s) before one is measured
    # Autoscaling (only with a provisioner): keep utilisation near target, act outside [scale_in_below, scale_out_above].
    provisioner: Literal["", "local"] = ""
    provision_dir: str = ""  # local: where wanted hosts are listed for the supervisor
    provision_hosts: str = ""  # local: the host ids it may start, comma-separated (`statefleet up` sets it)
    provision_timeout_s: PositiveFloat = 180.0  # a host asked for and never heard from stops counting as coming
    # The arrival rate (new sessions per second over the last `arrival_window_s`) sizes the warm pool over
    # `provision_lead_s`.
    arrival_window_s: PositiveFloat = 60.0

    def knobs(self) -> Knobs:
        return section(self, "", Knobs)

    def params(self, guard: Guard) -> Params:
        # Drain moves stay with the drainer (`drainer.py`): scale-in and `statefleet host drain` share it.
        return Params(guard=guard, drain_by_moves=False, **msgspec.structs.asdict(self.knobs()))

