"""Two waves of arrivals a few minutes apart, the shape of the Azure code trace's opening (two bursts with a
lull between): the hosts asked for in the first wave boot after it, and if the autoscaler gives them back in
the lull, the second wave's short clips end while still queued behind a 60 s boot."""

from __future__ import annotations

import msgspec

from bench import fleet, fleet_arms
from bench.fleet_sim import Sim
from bench.fleet_workload import SessionSpec

GIB = 1 << 30


def wave(start_s: float, n: int, duration_s: float, tag: str) -> list[SessionSpec]:
    return [SessionSpec(session_id=f"{tag}{i:03d}", arrival_s=start_s + 0.2 * i, duration_s=duration_s, tier=8,
                        state_bytes=4 * GIB, dirty_rate_bps=0.6e9, idle=()) for i in range(n)]


def drops(params) -> int:
    # first wave: 12 sessions (2.4 devices) for 50 s, gone before the hosts it asks for are up (~95 s);
    # second wave at 200 s: 14 clips of 20 s (2.8 devices), shorter than a boot
    specs = wave(30.0, 12, 50.0, "a") + wave(200.0, 14, 20.0, "b")
    specs.sort(key=lambda s: s.arrival_s)
    sim = Sim(specs, fleet_arms.policy(params), params, params.min_hosts + params.warm_pool_hosts, fleet.TICK_S,
              300.0, "statefleet", lambda *a: None, fleet_arms.reacting(params))
    return sim.run()["dropped_sessions"]


def uncapped():
    """The utilisation-target autoscaler (no latency cap): the first wave fits the starting hosts past the
    target, so only the scale-in cooldown decides whether the second wave finds hosts."""
    return msgspec.structs.replace(fleet.params("profile"), latency_cap_ms=0.0)


def test_hosts_a_wave_asked_for_are_still_there_for_the_next_wave():
    assert drops(uncapped()) == 0


def test_giving_them_back_in_the_lull_drops_the_second_waves_clips():
    p = msgspec.structs.replace(uncapped(), scale_in_cooldown_s=60.0, warm_pool_hosts=1)
    assert drops(p) > 0
