"""The placement service's settings: failover, reservations and drain here; the fleet controller's in
`control_config.py`. Every field is an `SF_<FIELD>` environment variable too."""

from __future__ import annotations

from typing import Annotated

import msgspec

from libs.config import PositiveFloat, PositiveInt
from services.placement.control_config import FleetControlConfig

Fraction = Annotated[float, msgspec.Meta(ge=0, lt=1)]


class PlacementConfig(FleetControlConfig, kw_only=True):
    # A reservation counts against its host until its heartbeat lists the session; one that never arrives
    # stops counting after a heartbeat this much newer (libs/contracts.py `unsettled`; covers clock skew).
    reservation_settle_s: PositiveFloat = 30.0
    # The guard band kept free on every host by failover and drain (admission passes its own for new sessions).
    guard_busy_fraction: Fraction = 0.1
    guard_memory_fraction: Fraction = 0.05
    max_sessions_per_host: PositiveInt = 64
    sweep_s: PositiveFloat = 1.0  # stranded and orphaned sessions are looked at again this often
    # An owner process never seen in a heartbeat counts as dead after this long (it may be newer than our view).
    unknown_incarnation_grace_s: PositiveFloat = 6.0
    # A reservation whose session fence shows owned elsewhere (moved out, lost race) is unreserved after this.
    reservation_grace_s: PositiveFloat = 30.0
    drain_move_deadline_s: PositiveFloat = 10.0  # each live move's horizon during a drain
    # A watch silent this long is re-opened (engines beat every 0.5 s, so theirs is short).
    engine_watch_silence_s: PositiveFloat = 3.0
    # After placement's own connection to the bus comes back, hosts get this long to reconnect and beat
    # before silence counts (their heartbeat entries may have expired while the bus was down).
    bus_reconnect_grace_s: PositiveFloat = 10.0
    # Every host silent at once reads as the bus failing beneath them, for at most this long.
    fleet_quiet_limit_s: PositiveFloat = 30.0
    watch_silence_s: PositiveFloat = 10.0
