"""The knobs of every fleet policy, with units in their names, each declared once with its one default.

`Knobs` is what an operator sets: the placement service takes every field of it as a config field
of the same name (`control_config.py`, `SF_<FIELD>`), and the simulator (`bench/fleet*.py`) and the
tests start from the same defaults. `Params` adds what the caller wires rather than tunes: the
guard band and who carries out a drain.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from libs.contracts import Guard

Frac = Annotated[float, msgspec.Meta(gt=0, lt=1)]
NonNeg = Annotated[float, msgspec.Meta(ge=0)]
Pos = Annotated[float, msgspec.Meta(gt=0)]


class Knobs(msgspec.Struct, frozen=True, kw_only=True):
    # Per-chunk latency model: "profile" (EDF response from the rows) or "colocation" (TurboServe-style).
    latency_model: Literal["profile", "colocation"] = "profile"
    colocation_alpha: NonNeg = 0.12  # colocation: each co-located session adds this fraction of a block
    # Placement and resumes aim to keep every session's predicted chunk latency within this share of its
    # SLO (window plus off-device stages); past it a host is used only when no fitting host is within it.
    latency_target_frac: Annotated[float, msgspec.Meta(gt=0)] = 0.55
    # Rebalancing: move only if Γ = L − L′ − η·κ > gain_threshold_ms (ms of predicted chunk latency).
    eta: NonNeg = 1.0
    gain_threshold_ms: NonNeg = 5.0
    move_cooldown_s: NonNeg = 60.0  # per session, after any move
    move_window_s: Pos = 600.0
    max_moves_per_window: Annotated[int, msgspec.Meta(ge=1)] = 2  # per session
    max_moves_per_round: Annotated[int, msgspec.Meta(ge=0)] = 4
    targets_per_session: Annotated[int, msgspec.Meta(ge=1)] = 4  # fitting receivers tried, least loaded first
    move_horizon_s: Pos = 2.0  # a live move must finish within this (admissibility horizon H)
    move_setup_s: NonNeg = 0.005  # X: connection, handshake, commit: part of a live move's freeze
    # Autoscaling: keep device utilisation near target_util; act outside [scale_in_below, scale_out_above].
    target_util: Frac = 0.5
    scale_out_above: Frac = 0.6
    scale_in_below: Frac = 0.35
    scale_out_cooldown_s: NonNeg = 10.0
    scale_in_cooldown_s: NonNeg = 180.0  # after the last scale-in or scale-out: three boots (provision_lead_s)
    # The fleet's bounds; the provisioner's own slots bound it too (`statefleet up --autoscale MIN:MAX` sets both).
    min_hosts: Annotated[int, msgspec.Meta(ge=1)] = 1
    max_hosts: Annotated[int, msgspec.Meta(ge=1)] = 100_000
    # Empty, pre-warmed hosts kept for bursts and resumes: at least warm_pool_hosts, or this share of the fleet
    # (without a latency cap; with one, nothing resumes and the lead-time term below sizes the pool).
    warm_pool_hosts: Annotated[int, msgspec.Meta(ge=0)] = 2
    warm_pool_frac: Annotated[float, msgspec.Meta(ge=0, lt=1)] = 0.1
    # ... and at least what the sessions arriving within one scale-out's lead time (boot and pre-warm) need.
    provision_lead_s: NonNeg = 60.0
    # Idle offload: suspend a session after this long without input (0 disables offload); new input resumes it.
    keep_warm_s: NonNeg = 120.0
    # An absolute latency cap (0: none). With one, placement, resumes and moves keep every predicted chunk,
    # cut-overs included, within `latency_cap_ms − cap_margin_ms`: each host is packed to the load at which
    # its chunk latency reaches that, a session no host can take within it waits (the autoscaler asks for
    # hosts), and the autoscaler counts demand in hosts at the cap (each session's share over the most load
    # a host carrying it may have within the cap), aiming at `cap_fill` of the hosts it keeps.
    latency_cap_ms: NonNeg = 0.0
    cap_margin_ms: NonNeg = 2.5
    cap_fill: Frac = 0.85  # scale out above this (hosts at the cap in use over hosts kept); queued and lead demand over it
    cap_scale_in_below: Frac = 0.7  # scale in once the pool is this full of the idle hosts (idle > pool / this)
    # Within the cap, place where the session wastes the least usable room, then the busiest (False:
    # busiest first only).
    cap_least_waste: bool = True
    # Host memory → device copy rate of a resume: with a cap, an idle session is suspended only when its
    # resume (this copy, then its first chunk) stays within the cap.
    resume_bps: Pos = 20e9
    # Overload relief acts once a device's measured load passes its limit (1 − guard) by more than this, and
    # then sheds down to the limit: the band between is what a device's measured load swings by while it
    # runs at the limit (±0.1 beside `bench.c1_periods`' clients on 2 cores), so a device that admission
    # filled to its limit is not relieved for its noise, and what relief frees is not taken straight back.
    overload_margin: Frac = 0.05
    # A C1 session shed as `capacity_lost` resumes onto the device it was shed from only this long after
    # (elsewhere at once): back on the device that could not keep it, the next swing shed it again (up to
    # six times a session in one 45 s `bench.c1_periods` round, 2026-12-07).
    shed_hold_s: NonNeg = 10.0


class Params(Knobs, frozen=True, kw_only=True):
    guard: Guard = Guard()
    # Who carries out a scale-in drain: the policy's own moves (the simulator), or, False, someone else (the
    # placement service's drainer); the policy then only waits for the host's sessions to end.
    drain_by_moves: bool = True
