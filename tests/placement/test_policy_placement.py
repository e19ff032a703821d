"""Initial placement, resume and the capacity promise: packed within the target, reservations, paths; no over-commit."""

from __future__ import annotations

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from libs import admissibility
from libs.contracts import Demand
from services.placement.policy import Move, PathRates, Place, Resume, Suspend, decide, react
from services.placement.policy.placement import Placer
from services.placement.policy.plan import Plan
from tests.placement.policy_fleet import PARAMS, fleet, sess, shared


def placed(d) -> dict[str, str]:
    return {a.session_id: a.host_id for a in d.actions if isinstance(a, Place)}


def test_packs_onto_the_busiest_host_within_the_target_and_the_baseline_takes_the_least_loaded():
    """h2 (0.4 busy) would put its tier-8 chunks past the target (70 ms > 0.55 × 110 ms) with a third; h0
    stays within it (50 ms), so it wins over the empty h1. The least-loaded baseline takes h1."""
    f = fleet({"h0": [sess("a", "h0")], "h1": [], "h2": [sess("b", "h2"), sess("c", "h2")]}, queued=(sess("q"),))
    assert placed(react(f, PARAMS)) == {"q": "h0"}
    assert Placer(Plan(f, PARAMS), pack=False).choose(sess("q"))[0].host_id == "h1"


def test_a_light_session_keeps_the_empty_host_free_for_a_heavy_one():
    """A tier-16 session is within its target (66 ms) only alone: 20 + 0.4 × 100 = 60 ms, 70 ms with a
    tier-4 beside it. Packed, the tier-4 arrival joins h0 and the tier-16 one gets the empty h1; least
    loaded first, the tier-4 would take h1 and the tier-16 would share a host past its target."""
    f = fleet({"h0": [sess("a", "h0", floor=4)], "h1": []}, queued=(sess("q4", floor=4), sess("q16", floor=16)))
    assert placed(react(f, PARAMS)) == {"q4": "h0", "q16": "h1"}


def test_reservations_count_against_a_host():
    f = fleet({"h0": [], "h1": [sess("a", "h1")]}, queued=(sess("q"),),
              reserved={"h0": (Demand(busy_fraction=0.8, state_bytes=0),)})
    assert placed(react(f, PARAMS)) == {"q": "h1"}


def test_prefers_a_host_whose_paths_keep_a_later_move_admissible():
    """h0 is the busiest host within the target but sits alone in a zone reached at 1 Gb/s: a session
    placed there is stuck."""
    paths = PathRates(default_bps=admissibility.gbps(100), cross_zone_bps=admissibility.gbps(1))
    f = fleet({"h0": [sess("a", "h0")], "h1": [], "h2": []}, queued=(sess("q"),), paths=paths)
    zoned = msgspec.structs.replace(f, hosts=tuple(
        msgspec.structs.replace(h, zone="far" if h.host_id == "h0" else "near") for h in f.hosts))
    assert placed(react(zoned, PARAMS)) == {"q": "h1"}  # (equal hosts: the lower id, `Placer._key`)
    assert placed(react(f, PARAMS)) == {"q": "h0"}  # one zone: the busiest within the target wins


def test_draining_hosts_take_no_new_session_and_no_fit_is_a_refusal():
    f = fleet({"h0": [], "h1": [sess(f"a{i}", "h1", floor=16) for i in range(2)]}, queued=(sess("q", floor=16),),
              states={"h0": "draining"})
    d = react(f, PARAMS)
    assert placed(d) == {} and [(r.kind, r.reason) for r in d.refusals] == [("place", "no_fit")]


def test_an_idle_session_is_suspended_after_keep_warm_and_resumes_home_on_input():
    p = msgspec.structs.replace(PARAMS, keep_warm_s=30.0)
    idle = fleet({"h0": [sess("a", "h0", last_input_at=960.0), sess("b", "h0", last_input_at=990.0)]})
    assert [a for a in decide(idle, p, rebalancing=False, scaling=False).actions] == [
        Suspend(session_id="a", host_id="h0")]
    no_input = fleet({"h0": [sess("a", "h0", state="suspended", suspended_at=970.0, last_input_at=960.0)]})
    assert react(no_input, p).actions == ()
    back = fleet({"h0": [sess("a", "h0", state="suspended", suspended_at=970.0, last_input_at=999.0)], "h1": []})
    assert react(back, p).actions == (Resume(session_id="a", host_id="h0", busy_fraction=0.2, state_bytes=2 << 30),)


def test_a_resume_whose_old_host_is_full_goes_where_there_is_room():
    full = [sess(f"x{i}", "h0", floor=16) for i in range(2)]
    f = fleet({"h0": [*full, sess("a", "h0", floor=16, state="suspended", suspended_at=970.0, last_input_at=999.0)],
               "h1": []})
    assert [(a.session_id, a.host_id) for a in react(f, PARAMS).actions] == [("a", "h1")]


fleets = st.lists(st.tuples(st.lists(st.sampled_from([4, 8, 16]), max_size=4), st.sampled_from(["up", "draining"]),
                            st.floats(0.0, 0.5)), min_size=1, max_size=5)


@given(fleets, st.lists(st.sampled_from([4, 8, 16]), max_size=8), st.floats(0.0, 20.0))
def test_no_decision_over_commits_a_host(spec, queued, threshold):
    on = {f"h{i}": [sess(f"h{i}s{j}", f"h{i}", floor=t) for j, t in enumerate(tiers)] for i, (tiers, _, _) in
          enumerate(spec)}
    bg = {f"h{i}": b for i, (_, _, b) in enumerate(spec)}
    f = fleet(on, states={f"h{i}": s for i, (_, s, _) in enumerate(spec)}, background=bg,
              queued=tuple(sess(f"q{k}", floor=t) for k, t in enumerate(queued)))
    p = msgspec.structs.replace(PARAMS, gain_threshold_ms=threshold, keep_warm_s=0.0)
    limit = 1.0 - p.guard.busy_fraction + 1e-9
    before = {h.host_id: h.entry.busy_fraction for h in f.hosts}
    added = dict.fromkeys(before, 0.0)
    for a in decide(f, p).actions:
        if isinstance(a, Place | Resume):
            added[a.host_id] += a.busy_fraction
        elif isinstance(a, Move):
            added[a.dst] += a.busy_fraction
    for hid, extra in added.items():
        if extra:
            assert before[hid] + extra <= max(limit, before[hid]), hid
    acted = [getattr(a, "session_id", None) for a in decide(f, p).actions]
    assert len([x for x in acted if x]) == len({x for x in acted if x}), "one action per session"


def test_a_resume_leaves_an_old_host_it_would_push_past_the_latency_target():
    """h0 fits the resume within the guard band (0.8 busy) but its chunks would take 90 ms, past 0.55 of
    their 110 ms SLO, while h1 is empty: the resume goes to h1. With nothing else open it stays home."""
    mine = sess("a", "h0", state="suspended", suspended_at=970.0, last_input_at=999.0)
    others = [sess(f"x{i}", "h0") for i in range(3)]
    d = react(fleet({"h0": [*others, mine], "h1": []}), PARAMS)
    assert [(a.session_id, a.host_id) for a in d.actions if isinstance(a, Resume)] == [("a", "h1")]
    alone = react(fleet({"h0": [*others, mine]}), PARAMS)
    assert [(a.session_id, a.host_id) for a in alone.actions if isinstance(a, Resume)] == [("a", "h0")]


def test_past_the_latency_target_placement_still_uses_the_guard_band_rather_than_queue():
    busy = [sess(f"x{i}", "h0") for i in range(3)]  # 0.6 busy: a fourth tier-8 session would see 90 ms
    assert placed(react(fleet({"h0": busy}, queued=(sess("q"),)), PARAMS)) == {"q": "h0"}


@given(fleets, st.sampled_from([4, 8, 16]), st.floats(0.3, 1.0))
def test_placement_stops_looking_only_where_no_host_further_on_could_be_within_the_target(spec, tier, target):
    """The placer scans only hosts no busier than the target allows: the host it picks is the one a scan
    of every host by the same ranking would pick (busiest first within the target, least busy past it)."""
    on = {f"h{i}": [sess(f"h{i}s{j}", f"h{i}", floor=t) for j, t in enumerate(tiers)] for i, (tiers, _, _) in
          enumerate(spec)}
    f = fleet(on, states={f"h{i}": s for i, (_, s, _) in enumerate(spec)},
              background={f"h{i}": b for i, (_, _, b) in enumerate(spec)})
    p = msgspec.structs.replace(PARAMS, latency_target_frac=target)
    q = sess("q", floor=tier)
    placer = Placer(Plan(f, p))
    got = placer.choose(q)
    ranked = []
    for i, hl in enumerate(placer.order):
        est = placer.plan.fit(q, hl)
        if est.fits:
            rank = (0 if placer.plan.within_target(q, hl) else 2) + (0 if placer._escapes(q, hl) else 1)
            ranked.append((rank, -i if rank < 2 else i, hl))
    want = min(ranked, key=lambda r: r[:2])[2].host_id if ranked else "no_fit"
    assert (got if isinstance(got, str) else got[0].host_id) == want


def test_equally_loaded_hosts_go_to_the_one_holding_more_sessions_then_the_lower_id():
    """Best fit's tie rule: two processes reading one device's pooled load keep taking sessions on the one
    that already serves it (one scheduler sees every deadline), and idle hosts fill in id order."""
    f = fleet({"h0": [], "h1": [], "h2": []}, queued=(sess("q"),), background={"h0": 0.2, "h1": 0.2, "h2": 0.2})
    assert placed(react(f, PARAMS)) == {"q": "h0"}
    busier = msgspec.structs.replace(f, hosts=tuple(
        msgspec.structs.replace(h, entry=msgspec.structs.replace(h.entry, sessions=2)) if h.host_id == "h2" else h
        for h in f.hosts))
    assert placed(react(busier, PARAMS)) == {"q": "h2"}


def test_past_the_target_a_shared_device_takes_a_session_on_the_process_holding_its_sessions():
    """h0 and h1 are two processes of one CPU (one pooled load: both read 0.4); a third tier-8 session is past
    the target on either. Least busy first ties them, and the tie must not split the device's sessions onto
    the idle process: h0 takes it. On two devices of their own the idle h1 does."""
    f = fleet({"h0": [sess("a", "h0"), sess("b", "h0")], "h1": []}, queued=(sess("q"),), background={"h1": 0.4})
    assert placed(react(f, PARAMS)) == {"q": "h1"}
    assert placed(react(shared(f, "h0", "h1"), PARAMS)) == {"q": "h0"}
