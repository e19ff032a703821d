"""The latency cap (`Params.latency_cap_ms`): placement packs each host to the cap and no further, a session
no host takes within it waits, no suspend is made whose resume would pass it, drains keep residents within it,
and the autoscaler counts demand in hosts at the cap."""

from __future__ import annotations

import msgspec

from services.placement.policy import Drain, Move, Place, ScaleOut, Suspend, decide, react
from services.placement.policy import latency as lat
from services.placement.policy.autoscale import measure
from services.placement.policy.plan import Plan
from tests.placement.policy_fleet import PARAMS, fleet, sess
from tests.support.fleet_rows import GIB

CAP = msgspec.structs.replace(PARAMS, latency_cap_ms=68.75, cap_margin_ms=2.5)


def placed(d) -> dict[str, str]:
    return {a.session_id: a.host_id for a in d.actions if isinstance(a, Place)}


def test_a_host_is_packed_to_the_cap_not_to_a_fraction_of_the_slo():
    """Two tier-8 and a tier-4 (0.5 busy): 10 + 50 = 60 ms for the tier-8s, within 66.25 ms; the 0.55 × SLO
    target (60.5 ms) also allows it, but a third tier-8 (70 ms) is past the cap and goes to the empty host."""
    f = fleet({"h0": [sess("a", "h0"), sess("b", "h0")], "h1": []}, queued=(sess("q4", floor=4), sess("q8")))
    got = placed(react(f, CAP))
    assert got == {"q4": "h0", "q8": "h1"}


def test_a_session_no_host_takes_within_the_cap_waits_and_the_autoscaler_asks_for_a_host():
    f = fleet({"h0": [sess("a", "h0", floor=16)], "h1": [sess("b", "h1", floor=16)]}, queued=(sess("q", floor=16),))
    assert placed(react(f, CAP)) == {}
    assert any(r.reason == "past_cap" for r in react(f, CAP).refusals)
    d = decide(f, msgspec.structs.replace(CAP, scale_out_cooldown_s=0.0))
    assert any(isinstance(a, ScaleOut) for a in d.actions)
    # without the cap the same session shares a host past the target (the guard band is the limit)
    assert placed(react(f, PARAMS)) != {}


def test_no_suspend_whose_resume_would_pass_the_cap():
    """The resume may land on a host packed to the target (66.25 ms), so its copy must fit in the 2.5 ms
    above it: 4 GiB (~215 ms) and 0.5 GiB (~27 ms, within the cap alone but not beside others) never do;
    32 MiB (~1.7 ms) does."""
    idle = dict(last_input_at=0.0)
    p = msgspec.structs.replace(CAP, keep_warm_s=30.0)
    big = fleet({"h0": [sess("a", "h0", state_bytes=4 * GIB, **idle)]})
    half = fleet({"h0": [sess("a", "h0", state_bytes=GIB // 2, **idle)]})
    assert not [a for a in decide(half, p).actions if isinstance(a, Suspend)]
    small = fleet({"h0": [sess("a", "h0", state_bytes=32 << 20, **idle)]})
    assert not [a for a in decide(big, p).actions if isinstance(a, Suspend)]
    assert [a for a in decide(small, p).actions if isinstance(a, Suspend)]


def test_a_drain_never_puts_a_receivers_residents_past_the_cap():
    """h0 drains a tier-8; h1 holds two tier-8 (a third would make 70 ms), h2 one: only h2 may take it."""
    f = fleet({"h0": [sess("a", "h0")], "h1": [sess("b", "h1"), sess("c", "h1")], "h2": [sess("d", "h2")]},
              states={"h0": "draining"})
    moves = [a for a in decide(f, CAP, rebalancing=False, scaling=False).actions if isinstance(a, Move)]
    assert [(m.session_id, m.dst) for m in moves] == [("a", "h2")]


def test_demand_is_counted_in_hosts_at_the_cap():
    """Weights at 66.25 ms (off-device stages a third of each block): tier 4 0.1 / 0.629, tier 8 0.2 / 0.596,
    tier 16 0.4 / 0.529; a tier 16 leaves 0.129 of room, so beside sessions no lighter than 0.13 it takes a
    host to itself."""
    f = fleet({"h0": [sess("a", "h0", floor=4)], "h1": [sess("b", "h1")], "h2": [sess("c", "h2", floor=16)]})
    m = measure(Plan(f, CAP), [])
    within = {b: (66.25 - b / 3) / 100 for b in (10.0, 20.0, 40.0)}
    assert abs(m.load - (0.1 / within[10.0] + 0.2 / within[20.0] + 0.4 / within[40.0])) < 1e-9
    plan = Plan(f, CAP)
    heavy = plan.term(sess("x", floor=16), plan.loads["h0"])
    assert lat.cap_weight(CAP, heavy, 0.13) == 1.0 and lat.cap_weight(CAP, heavy, 0.1) < 1.0


def test_scale_in_drains_only_below_its_band():
    f = fleet({"h0": [sess("a", "h0", floor=16)], "h1": [], "h2": [], "h3": []}, last_scale_out_at=-1e9,
              last_scale_in_at=-1e9)
    drains = [a for a in decide(f, CAP).actions if isinstance(a, Drain)]
    assert drains and "h0" not in {d.host_id for d in drains}  # empty hosts go first


def test_with_a_cap_the_hosts_in_use_count_whole_and_only_the_pool_stays_empty():
    """Placement packs each host to the cap, so each host in use counts as one host of demand (three lone
    tier-4 sessions weigh 0.49 of a host at the cap, yet hold three); the fleet wants those plus the pool,
    not a fraction of hosts kept empty on top."""
    f = fleet({"h0": [sess("a", "h0", floor=4)], "h1": [sess("b", "h1", floor=4)], "h2": [sess("c", "h2", floor=4)],
               "h3": [], "h4": [], "h5": [], "h6": [], "h7": [], "h8": []},
              last_scale_out_at=-1e9, last_scale_in_at=-1e9)
    m = measure(Plan(f, CAP), [])
    assert m.load < 1 and m.want == 3 + m.pool and m.idle_hosts == 6
    # six idle hosts are more than the pool over cap_scale_in_below: give back down to the want, empty first,
    # though utilisation over the hosts kept is not below the band's fraction of them
    drains = {a.host_id for a in decide(f, CAP).actions if isinstance(a, Drain)}
    assert len(drains) == 9 - m.want and not drains & {"h0", "h1", "h2"}


def test_within_the_cap_a_session_goes_where_it_wastes_the_least_room():
    """Under the colocation model (these rows: at most 3 sessions beside a tier-8, 6 beside tier-4s) a tier-4
    beside a lone tier-8 takes 1/6 of a host and leaves 1/3 usable where 2/3 was (1/6 wasted); beside another
    tier-4 it wastes nothing. Busiest first sent it to the tier-8 host. Under the profile model the same
    tier-4 fills room beside the tier-8 that only a tier-4 could use, so it still goes there."""
    f = fleet({"h0": [sess("a", "h0")], "h1": [], "h2": [sess("b", "h2", floor=4)]}, queued=(sess("q", floor=4),))
    coloc = msgspec.structs.replace(CAP, latency_model="colocation", colocation_alpha=0.667)
    assert placed(react(f, coloc)) == {"q": "h2"}
    assert placed(react(f, msgspec.structs.replace(coloc, cap_least_waste=False))) == {"q": "h0"}
    assert placed(react(f, CAP)) == {"q": "h0"}
    # with no tier-4 host, an empty host wastes nothing either: it takes the tier-4, the tier-8 host keeps
    # its room for a tier-8
    f = fleet({"h0": [sess("a", "h0")], "h1": []}, queued=(sess("q", floor=4),))
    assert placed(react(f, coloc)) == {"q": "h1"}


def test_with_a_cap_the_pool_is_the_arrivals_not_a_share_of_the_fleet():
    """Nothing is offloaded under the cap, so nothing resumes into the pool: it holds what one lead time of
    arrivals needs (none here) and `warm_pool_hosts`, not `warm_pool_frac` of the hosts in use on top."""
    f = fleet({f"h{i}": [sess(f"s{i}", f"h{i}", floor=16)] for i in range(20)})
    p = msgspec.structs.replace(CAP, warm_pool_hosts=1, warm_pool_frac=0.2)
    assert measure(Plan(f, p), []).pool == 1
    assert measure(Plan(f, msgspec.structs.replace(p, latency_cap_ms=0.0)), []).pool == 4
