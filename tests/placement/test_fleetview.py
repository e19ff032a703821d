"""The service's snapshot for the policies (`fleetview`): pure, so tested without a bus."""

from __future__ import annotations

import msgspec

from libs.schemas.engine import SessionInfo
from libs.schemas.placement import HostRecord, Reserved
from services.placement import fleetview
from services.placement.policy import Params, Resume, Suspend, decide
from tests.support.fleet_rows import c1, host, rows

PARAMS = Params(keep_warm_s=30.0, warm_pool_hosts=0, warm_pool_frac=0.0)


def info(sid: str, state: str = "running", cursor: int = 0) -> SessionInfo:
    return SessionInfo(session_id=sid, backend="world", state=state, session_class="C1", tier=4, blocks_done=1,
                       input_cursor=cursor, consumed_seq=cursor, state_bytes=1 << 20)


def inputs(now: float, sessions: dict, owners: dict, **kw) -> fleetview.Inputs:
    profile = [msgspec.structs.replace(r, dirty_bytes_per_block=1000) for r in rows()]
    entries = [host("h0", profile=profile), host("h1", profile=profile)]
    specs = {sid: (c1(), "world") for sid in owners}
    return fleetview.Inputs(now=now, wall_now=1000.0, entries=entries, records=kw.pop("records", {}),
                            sessions=sessions, owners=owners, specs=specs, busy=kw.pop("busy", {}), path_bps=1e9,
                            settle_s=6.0, **kw)


def test_a_session_counts_only_on_the_host_that_owns_it():
    x = inputs(0.0, {"h0": [info("a")], "h1": [info("a")]}, {"a": "h1"})  # h0 still holds a moved-away copy
    fleet = fleetview.snapshot(x, fleetview.Activity())
    assert [(s.session_id, s.host_id) for s in fleet.sessions] == [("a", "h1")]
    assert fleet.sessions[0].dirty_rate_bps == 1000 * 1e3 / 100.0  # a block's dirty bytes every period


def test_reservations_in_flight_and_lifecycle_reach_the_hosts():
    record = HostRecord(host_id="h1", state="draining",
                        sessions={"b": Reserved(busy_fraction=0.2, state_bytes=1, at=999.0)})
    x = inputs(0.0, {"h0": [info("a")]}, {"a": "h0"}, records={"h1": record}, busy={"a": ("h0", "h1")})
    fleet = fleetview.snapshot(x, fleetview.Activity())
    h0, h1 = fleet.hosts
    assert (h1.state, h1.moves_in, len(h1.reserved)) == ("draining", 1, 1)  # unsettled reservation counts
    assert (h0.state, h0.moves_in) == ("up", 0)
    assert fleet.sessions[0].state == "moving"  # one action at a time: the policies leave it alone


def test_idle_sessions_suspend_after_keep_warm_and_new_input_resumes_them():
    seen = fleetview.Activity()
    owners = {"a": "h0", "b": "h0"}
    fleetview.snapshot(inputs(0.0, {"h0": [info("a", cursor=3), info("b", cursor=1)]}, owners), seen)
    # b takes input at 20 s; at 31 s only a has been idle for keep-warm.
    fleetview.snapshot(inputs(20.0, {"h0": [info("a", cursor=3), info("b", cursor=2)]}, owners), seen)
    fleet = fleetview.snapshot(inputs(31.0, {"h0": [info("a", cursor=3), info("b", cursor=2)]}, owners), seen)
    assert [a for a in decide(fleet, PARAMS, scaling=False).actions if isinstance(a, Suspend)] == \
        [Suspend(session_id="a", host_id="h0")]
    seen.suspended("a", 31.0)
    fleet = fleetview.snapshot(inputs(40.0, {"h0": [info("a", "suspended", 3), info("b", cursor=4)]}, owners), seen)
    assert not [a for a in decide(fleet, PARAMS, scaling=False).actions if isinstance(a, Resume)]
    fleet = fleetview.snapshot(inputs(41.0, {"h0": [info("a", "suspended", 4), info("b", cursor=5)]}, owners), seen)
    (resume,) = [a for a in decide(fleet, PARAMS, scaling=False).actions if isinstance(a, Resume)]
    assert (resume.session_id, resume.host_id) == ("a", "h0")  # its own host has room


def test_arrivals_count_new_sessions_over_the_window_and_none_at_first_sight():
    a = fleetview.Arrivals()
    assert a.rate({"a", "b", "c"}, 0.0, 10.0) == 0.0  # a new lease holder finds them: not arrivals
    assert a.rate({"a", "b", "c", "d", "e"}, 1.0, 10.0) == 0.2
    assert a.rate({"a", "e", "f"}, 5.0, 10.0) == 0.3  # closed ones leaving the hint take nothing back
    assert a.rate({"a", "e", "f"}, 11.0, 10.0) == 0.1  # d and e are out of the window, f is not
    assert a.rate({"a", "e", "f"}, 15.0, 10.0) == 0.0
    fleet = fleetview.snapshot(fleetview.Inputs(
        now=0.0, wall_now=0.0, entries=[host("h0")], records={}, sessions={}, owners={}, specs={}, busy={},
        path_bps=1e9, settle_s=6.0, arrivals_per_s=0.3), fleetview.Activity())
    assert fleet.arrivals_per_s == 0.3


def test_admission_s_queue_is_load_the_autoscaler_scales_out_for():
    """A session admission queues because no host fits it now (here: memory) is in the snapshot: the
    policies try to place it, and since it fits nowhere the autoscaler asks for a host, although the
    fleet's device utilisation alone (0.1) is far below the band. Without it, nothing would scale."""
    from libs.contracts import Estimate
    from libs.schemas.admission import AdmissionVerdict, SessionRecord
    from services.placement.policy import ScaleOut

    full = [host(h, busy=0.1, free=1 << 30) for h in ("h0", "h1")]  # a session takes 2 GiB
    why = [Estimate(host_id=h.host_id, fits=False, reason="memory", state_bytes=2 << 30) for h in full]
    waiting = SessionRecord(session_id="q", backend="world", contract=c1(), seed=1, prompt="", state="queued",
                            verdict=AdmissionVerdict(outcome="queued", estimates=why), created_at=1.0, updated_at=1.0)
    placed = msgspec.structs.replace(waiting, session_id="p", state="placed")

    def scale_outs(admissions):
        fleet = fleetview.snapshot(fleetview.Inputs(
            now=0.0, wall_now=1000.0, entries=full, records={}, sessions={}, owners={}, specs={}, busy={},
            path_bps=1e9, settle_s=6.0, admissions=admissions), fleetview.Activity())
        return [a for a in decide(fleet, PARAMS).actions if isinstance(a, ScaleOut)], fleet

    outs, fleet = scale_outs([waiting])
    assert [(s.session_id, s.state, s.state_bytes) for s in fleet.sessions] == [("q", "queued", 2 << 30)]
    assert outs and outs[0].count >= 1
    assert scale_outs([])[0] == []
    assert scale_outs([placed])[0] == []  # placed: its host's reservation counts, not admission's queue


def test_measured_path_rates_reach_the_policies_and_the_prior_covers_the_rest():
    from libs.path_ewma import PathEwma

    ewma = PathEwma(alpha=0.5)
    ewma.observe("h0", "h1", 4_000_000_000, 2.0)  # 2 GB/s
    ewma.observe("h0", "h1", 1_000_000_000, 1.0)  # 1 GB/s: the EWMA halves the difference
    ewma.observe("h1", "h0", 0, 1.0)  # nothing crossed: no rate learned
    assert ewma.pairs() == {"h0>h1": 1.5e9}
    fleet = fleetview.snapshot(inputs(0.0, {"h0": [info("a")]}, {"a": "h0"}, path_pairs=ewma.pairs()),
                               fleetview.Activity())
    h0, h1 = fleet.hosts
    assert fleet.paths.rate(h0, h1) == 1.5e9 and fleet.paths.rate(h1, h0) == 1e9  # the configured prior


def test_a_deadline_sessions_dirty_rate_is_one_block_per_release_period():
    """A C2a session due 100 blocks in 10 s rewrites a block's bytes every 100 ms, not every block_ms (a
    block is computed in a few ms and then waits for its release): the move's predicted freeze and its
    admissibility take this rate."""
    from libs.contracts import Contract

    c2 = Contract(session_class="C2a", quality_floor=1, determinism="T1", deadline_ms=10_000.0, blocks_per_window=100)
    profile = [msgspec.structs.replace(r, dirty_bytes_per_block=1000) for r in rows()]
    assert fleetview.dirty_rate_bps(c2, "world", host("h0", profile=profile)) == 1000 * 1e3 / 100.0
