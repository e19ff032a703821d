"""The simulator keeps host and session views between snapshots (bench/fleet_sim.py): every snapshot it
hands a policy must equal one built from scratch from the model fleet at that instant, through arrivals,
idle spells, suspends, resumes, moves, drains and releases (the TurboServe arm does all of them)."""

from __future__ import annotations

import bisect
import math

from bench import fleet, fleet_arms, fleet_turboserve
from bench.fleet_sim import BACKEND, CONTRACTS, HOST_MEMORY, PATHS, PROFILE, ROW, Sim, share
from libs.schemas.common import EngineEntry
from services.placement.policy import Fleet, Host, Session

SIZE = {"concurrency": 25, "generated_span_s": 900.0}


def fresh(sim: Sim) -> Fleet:
    """The snapshot built with nothing kept from an earlier one."""
    now, window = sim.now, sim.params.move_window_s
    hosts = []
    for h in sim.hosts.values():
        if h.state not in ("up", "draining"):
            continue
        tiers = [sim.sessions[sid].spec.tier for sid in h.resident]
        entry = EngineEntry(host_id=h.host_id, device="cuda:0", memory_bytes=HOST_MEMORY,
                            free_memory_bytes=HOST_MEMORY - sum(ROW[t].state_bytes for t in tiers),
                            sessions=len(tiers), profile=PROFILE, busy_fraction=math.fsum(share(t) for t in tiers),
                            heartbeat_at=now)
        hosts.append(Host(entry=entry, state="up" if h.state == "up" else "draining", zone=h.zone,
                          nic_bps=h.nic_bps, reserved=tuple(h.incoming.values()), moves_in=len(h.incoming)))
    sessions = []
    for s in sim.live.values():
        sp = s.spec
        i = bisect.bisect_right([a for a, _ in sp.idle], now) - 1
        last = sp.idle[i][0] if i >= 0 and now < sp.idle[i][1] else now
        sessions.append(Session(session_id=sp.session_id, backend=BACKEND, contract=CONTRACTS[sp.tier], state=s.state,
                                host_id=s.host, state_bytes=sp.state_bytes, dirty_rate_bps=sp.dirty_rate_bps,
                                last_input_at=last, suspended_at=s.suspended_at,
                                moves=tuple(t for t in s.moves if t > now - window)))
    kept = sim.snapshot()
    return Fleet(now=now, hosts=tuple(hosts), sessions=tuple(sessions), paths=PATHS, provisioning=kept.provisioning,
                 arrivals_per_s=kept.arrivals_per_s, arrivals_peak_per_s=kept.arrivals_peak_per_s,
                 last_scale_out_at=sim.last_out, last_scale_in_at=sim.last_in)


class Checked(Sim):
    """A `Sim` that checks every snapshot it takes against a fresh build."""

    checked = 0

    def snapshot(self) -> Fleet:
        kept = super().snapshot()
        if not getattr(self, "_in_fresh", False):
            self._in_fresh = True
            try:
                assert kept == fresh(self), f"snapshot at {self.now} differs from a fresh build"
            finally:
                self._in_fresh = False
            self.checked += 1
        return kept


def run(arm: str, seed: int) -> Checked:
    _, specs, _ = fleet.workload(None, seed, SIZE)
    _, _, end = fleet.offered(specs)
    p = fleet.params("profile")
    if arm == "turboserve":
        ts = fleet_turboserve.TurboServe(p, fleet_turboserve.sessions_per_gpu(specs, p, fleet.oracle_terms(), fleet.CAP_MS))
        decide, react, stop_and_copy = ts, ts.react, True
    else:
        decide, react, stop_and_copy = fleet_arms.policy(p), fleet_arms.reacting(p), False
    sim = Checked(specs, decide, p, p.min_hosts + p.warm_pool_hosts, fleet.TICK_S, end, arm, lambda *a: None, react,
                  stop_and_copy=stop_and_copy)
    sim.result_ = sim.run()
    return sim


def test_every_turboserve_snapshot_equals_a_fresh_one():
    sim = run("turboserve", 1)
    r = sim.result_
    assert sim.checked > 100
    assert r["suspends"] and r["resumes"] and r["migrations"]  # the paths the views must follow were taken


def test_every_statefleet_snapshot_equals_a_fresh_one():
    sim = run("statefleet", 2)
    assert sim.checked > 100
