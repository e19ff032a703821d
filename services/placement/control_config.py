"""The fleet controller's settings (rebalancing, autoscaling, idle offload), part of `PlacementConfig`.

Every field is an `SF_<FIELD>` environment variable too. `params()` turns them into the pure
policies' `Params` (services/placement/policy/params.py), the one place their knobs meet.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from libs.config import BaseConfig, PositiveFloat
from libs.contracts import Guard
from services.placement.policy import Params

NonNeg = Annotated[float, msgspec.Meta(ge=0)]
Frac = Annotated[float, msgspec.Meta(gt=0, lt=1)]
Count = Annotated[int, msgspec.Meta(ge=0)]


class FleetControlConfig(BaseConfig, kw_only=True):
    # The controller runs in one placement instance at a time (a lease in `sf_placement_lease`).
    fleet_control: bool = True
    control_s: PositiveFloat = 1.0  # one decision (snapshot, decide, apply) this often
    lease_ttl_s: PositiveFloat = 6.0
    # Rebalancing: move a session only if Γ = L − L′ − η·κ exceeds the threshold (ms of predicted chunk latency).
    rebalance: bool = True
    gain_threshold_ms: NonNeg = 5.0
    eta: NonNeg = 1.0
    move_cooldown_s: NonNeg = 60.0  # per session, after any move
    move_window_s: PositiveFloat = 600.0
    max_moves_per_window: Annotated[int, msgspec.Meta(ge=1)] = 2  # per session
    max_moves_per_round: Count = 4
    move_horizon_s: PositiveFloat = 2.0  # a live move must be admissible within this horizon H
    path_bps: PositiveFloat = 1e9  # data-plane rate assumed between two hosts (bytes/s)
    move_setup_s: NonNeg = 0.005  # a live move's fixed cost (connection, handshake, commit): part of its freeze
    # Idle offload: suspend a session after this long without input (0: never); it resumes on new input.
    keep_warm_s: NonNeg = 120.0
    # Autoscaling (only with a provisioner): keep utilisation near target, act outside [scale_in_below, scale_out_above].
    provisioner: Literal["", "local"] = ""
    provision_dir: str = ""  # local: where wanted hosts are listed for the supervisor
    provision_hosts: str = ""  # local: the host ids it may start, comma-separated (`statefleet up` sets it)
    provision_timeout_s: PositiveFloat = 180.0  # a host asked for and never heard from stops counting as coming
    min_hosts: Annotated[int, msgspec.Meta(ge=1)] = 1
    max_hosts: Annotated[int, msgspec.Meta(ge=1)] = 8
    target_util: Frac = 0.5
    scale_out_above: Frac = 0.6
    scale_in_below: Frac = 0.35
    scale_out_cooldown_s: NonNeg = 10.0
    scale_in_cooldown_s: NonNeg = 180.0
    warm_pool_hosts: Count = 2  # empty, pre-warmed hosts kept for bursts and resumes
    warm_pool_frac: Annotated[float, msgspec.Meta(ge=0, lt=1)] = 0.1
    # A host asked for serves about this long after: the pool also holds what the arrival rate (new sessions
    # per second over the last `arrival_window_s`) brings meanwhile. 0: arrivals do not size the pool.
    provision_lead_s: NonNeg = 60.0
    arrival_window_s: PositiveFloat = 60.0

    def params(self, guard: Guard) -> Params:
        # Drain moves stay with the drainer (`drainer.py`): scale-in and `statefleet host drain` share it.
        return Params(guard=guard, eta=self.eta, gain_threshold_ms=self.gain_threshold_ms,
                      move_cooldown_s=self.move_cooldown_s, move_window_s=self.move_window_s,
                      max_moves_per_window=self.max_moves_per_window, max_moves_per_round=self.max_moves_per_round,
                      move_horizon_s=self.move_horizon_s, move_setup_s=self.move_setup_s, target_util=self.target_util,
                      scale_out_above=self.scale_out_above, scale_in_below=self.scale_in_below,
                      scale_out_cooldown_s=self.scale_out_cooldown_s, scale_in_cooldown_s=self.scale_in_cooldown_s,
                      min_hosts=self.min_hosts, max_hosts=self.max_hosts, warm_pool_hosts=self.warm_pool_hosts,
                      warm_pool_frac=self.warm_pool_frac, provision_lead_s=self.provision_lead_s,
                      drain_by_moves=False, keep_warm_s=self.keep_warm_s)
