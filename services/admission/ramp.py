"""How far admission takes a device past the concurrency its prices were measured at: step by step.

A price is only known at the number of sessions it was measured beside. The co-location curve carries
it to more sessions, but the curve is measured at start-up, on scratch sessions with nothing else on
the machine, and serving is dearer than that by a factor that grows with the number of sessions (the
stack's own processes, the clients, the interpreter's lock): on a 2-core machine serving measured 1.3x
start-up's block beside one session and 2-3x beside fifteen (`bench.c1_periods --overload`,
2026-12-07). Priced at start-up's curve, a burst of sixteen arrivals was admitted at once onto a
device that carried eleven, every one ran late until overload relief shed some, and the room each
shed session freed admitted the next waiter into the same overload.

So admission grows a device like a congestion window: up to `initial` sessions at the curve's prices,
then at most `growth` more than the concurrency its hosts have measured themselves serving
(`EngineEntry.measured_sessions`, summed over the device's hosts), at least one more. A candidate past
that waits in the queue (`ramping`) until a heartbeat shows the device measured at its new size, and
is then priced at what the device really costs there. The capacity checks still apply at every step;
the ramp only stops admission from trusting an extrapolation more than one step ahead. Only sessions
with a window take device share, so only they are ramped. Failover, drains and moves re-place sessions
already admitted and are not ramped: their load was budgeted when they were admitted.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import msgspec

from libs.contracts import Contract, Estimate, device_key
from libs.schemas.common import EngineEntry


class Ramp(msgspec.Struct, kw_only=True, frozen=True):
    initial: int = 4  # sessions a device takes at start-up's prices before it has measured any
    growth: float = 0.25  # then at most this share more than it was measured serving (at least one)

    def allowed(self, measured: int) -> int:
        """The most sessions a device measured serving `measured` may hold (its queue's head included)."""
        return max(self.initial, measured + max(1, math.ceil(self.growth * measured)))


def device_measured(hosts: Sequence[EngineEntry]) -> dict[str, int]:
    """Sessions each device was measured serving: the sum over the hosts that share it."""
    out: dict[str, int] = {}
    for h in hosts:
        out[device_key(h)] = out.get(device_key(h), 0) + h.measured_sessions
    return out


def ramped(e: Estimate, contract: Contract, measured: int, ramp: Ramp) -> Estimate:
    """`e` as admission decides it: a fitting estimate that would take its device (`e.device_sessions`
    before the candidate) past `ramp.allowed(measured)` does not fit now (`ramping`)."""
    if not e.fits or contract.window_ms is None or e.device_sessions + 1 <= ramp.allowed(measured):
        return e
    return msgspec.structs.replace(e, fits=False, reason="ramping")
