"""Autoscaling: hysteresis and cooldowns, scale-in as a drain that never drops or strands a session."""

from __future__ import annotations

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from services.placement.policy import Drain, Move, ScaleOut, StopHost, decide
from services.placement.policy.plan import Plan
from services.placement.policy.rebalance import drain_moves
from tests.placement.policy_fleet import PARAMS, fleet, sess

P = msgspec.structs.replace(PARAMS, target_util=0.5, scale_out_above=0.6, scale_in_below=0.35,
                            scale_in_cooldown_s=0.0, scale_out_cooldown_s=30.0)


def kinds(d, kind):
    return [a for a in d.actions if isinstance(a, kind)]


def test_scales_out_above_the_band_and_not_within_it():
    hot = fleet({"h0": [sess(f"a{i}", "h0") for i in range(4)], "h1": [sess(f"b{i}", "h1") for i in range(3)]})
    out = kinds(decide(hot, P, rebalancing=False), ScaleOut)
    assert out and out[0].count == 1  # load 1.4 at target 0.5 wants 3 hosts
    inside = fleet({"h0": [sess(f"a{i}", "h0") for i in range(3)], "h1": [sess(f"b{i}", "h1") for i in range(2)]})
    assert decide(inside, P, rebalancing=False).actions == ()


def test_scale_out_waits_out_its_cooldown_and_counts_hosts_still_booting():
    hot = dict(hosts={"h0": [sess(f"a{i}", "h0") for i in range(4)]})
    assert kinds(decide(fleet(**hot, last_scale_out_at=990.0), P), ScaleOut) == []
    assert kinds(decide(fleet(**hot, provisioning=1), P), ScaleOut) == []


def test_a_queued_session_no_host_fits_asks_for_a_host():
    full = fleet({"h0": [sess(f"a{i}", "h0", floor=16) for i in range(2)]}, queued=(sess("q", floor=16),))
    d = decide(full, P)
    assert kinds(d, ScaleOut) and any(r.kind == "place" and r.session_id == "q" for r in d.refusals)


def test_scale_in_drains_the_least_loaded_host_and_releases_an_empty_one_at_once():
    f = fleet({"h0": [sess("a", "h0", floor=4)], "h1": [], "h2": [sess("b", "h2", floor=4), sess("c", "h2", floor=4)]})
    d = decide(f, P, rebalancing=False)
    assert [a.host_id for a in kinds(d, Drain)] == ["h1", "h0"]  # empty first, then least busy
    assert [a.host_id for a in kinds(d, StopHost)] == ["h1"]  # h0 still owns "a"


def test_a_draining_host_is_emptied_by_live_moves_then_released():
    on = {"h0": [sess("a", "h0"), sess("b", "h0")], "h1": [sess("c", "h1")]}
    states = {"h0": "draining"}
    for _ in range(4):
        d = decide(fleet(on, states=states), P, rebalancing=False, scaling=True)
        for m in kinds(d, Move):
            moved = next(s for s in on[m.src] if s.session_id == m.session_id)
            on[m.src].remove(moved)
            on[m.dst].append(msgspec.structs.replace(moved, host_id=m.dst, moves=(1000.0,)))
        if kinds(d, StopHost):
            break
    assert [a.host_id for a in kinds(d, StopHost)] == ["h0"]
    assert sorted(s.session_id for s in on["h1"]) == ["a", "b", "c"]


def test_a_drain_move_never_makes_a_chunk_later_than_the_guard_band_allows():
    """h1 fits the tier-8 session at 0.9 busy, where its chunks take 100 ms (the guard band's worst for
    it); the cut-over adds the freeze (~9 ms), so the drain waits rather than make a 109 ms chunk. An
    empty receiver takes it at once, and without the rule h1 would have."""
    crowded = fleet({"h0": [sess("a", "h0")], "h1": []}, states={"h0": "draining"}, background={"h1": 0.7})
    d = decide(crowded, P, rebalancing=False, scaling=False)
    assert kinds(d, Move) == [] and [(r.kind, r.reason) for r in d.refusals] == [("drain", "past_guard")]
    moves, _ = drain_moves(Plan(crowded, P), within_guard=False)
    assert [(m.session_id, m.dst) for m in moves] == [("a", "h1")]
    roomy = fleet({"h0": [sess("a", "h0")], "h1": [], "h2": []}, states={"h0": "draining"}, background={"h1": 0.7})
    assert [(m.session_id, m.dst) for m in kinds(decide(roomy, P, rebalancing=False, scaling=False), Move)] == [
        ("a", "h2")]


hosts_st = st.dictionaries(st.sampled_from([f"h{i}" for i in range(6)]),
                           st.tuples(st.sampled_from(["up", "draining"]),
                                     st.lists(st.tuples(st.sampled_from([4, 8, 16]),
                                                        st.sampled_from(["serving", "suspended", "moving"])),
                                              max_size=3)),
                           min_size=1, max_size=6)


@given(hosts_st, st.floats(0.05, 0.5), st.booleans())
def test_scale_in_never_drops_a_session_nor_releases_a_host_that_owns_one(spec, target, drain_by_moves):
    p = msgspec.structs.replace(P, target_util=target, scale_in_below=min(0.45, target * 0.9),
                                drain_by_moves=drain_by_moves, keep_warm_s=0.0)
    on = {hid: [sess(f"{hid}s{i}", hid, floor=f, state=state, suspended_at=999.0, last_input_at=900.0)
                for i, (f, state) in enumerate(ss)] for hid, (_, ss) in spec.items()}
    states = {hid: s for hid, (s, _) in spec.items()}
    f = fleet(on, states=states)
    d = decide(f, p)
    released = {a.host_id for a in kinds(d, StopHost)}
    for s in f.sessions:
        assert s.host_id not in released, f"{s.session_id} ({s.state}) would be stranded on {s.host_id}"
    moved_to = {a.dst for a in kinds(d, Move)}
    assert not released & moved_to
    assert not any(isinstance(a, StopHost) and states.get(a.host_id) == "up" and on[a.host_id] for a in d.actions)


def test_a_short_pre_warmed_pool_asks_for_hosts_even_at_low_utilisation():
    """One host at 0.2 busy and no empty host: the pool of one is missing, so a host is asked for."""
    p = msgspec.structs.replace(P, warm_pool_hosts=1)
    assert kinds(decide(fleet({"h0": [sess("a", "h0")]}), p), ScaleOut) == [ScaleOut(count=1)]
    assert kinds(decide(fleet({"h0": [sess("a", "h0")], "h1": []}), p), ScaleOut) == []


def test_the_pool_covers_the_sessions_arriving_within_one_scale_outs_lead_time():
    """0.1 sessions/s over a 60 s lead at a mean share of 0.2, filled to 0.5: three more hosts' worth."""
    p = msgspec.structs.replace(P, warm_pool_hosts=1, provision_lead_s=60.0)
    hosts = {"h0": [sess("a", "h0"), sess("b", "h0")], "h1": []}
    assert kinds(decide(fleet(hosts, arrivals_per_s=0.1), p), ScaleOut) == [ScaleOut(count=2)]
    assert kinds(decide(fleet(hosts, arrivals_per_s=0.0), p), ScaleOut) == []


def test_scale_in_waits_its_cooldown_after_a_scale_out_too():
    idle = dict(hosts={"h0": [sess("a", "h0")], "h1": [], "h2": []})
    p = msgspec.structs.replace(P, scale_in_cooldown_s=180.0)
    assert kinds(decide(fleet(**idle, last_scale_out_at=900.0), p), Drain) == []  # 100 s after a scale-out
    assert kinds(decide(fleet(**idle, last_scale_out_at=800.0), p), Drain)
