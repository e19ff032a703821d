"""Min-max rebalancing: the gain threshold, the admissibility gate, no incast, no thrash."""

from __future__ import annotations

import msgspec

from libs import admissibility
from services.placement.policy import Move, PathRates, decide
from services.placement.policy.plan import Plan
from services.placement.policy.rebalance import hoped, rebalance
from tests.placement.policy_fleet import PARAMS, fleet, sess

P = msgspec.structs.replace(PARAMS, gain_threshold_ms=0.0)


def hot_and_cold():
    return fleet({"h0": [sess(f"s{i}", "h0") for i in range(4)], "h1": []})


def moves_of(d) -> list[Move]:
    return [a for a in d.actions if isinstance(a, Move)]


def test_moves_off_the_bottleneck_when_the_gain_exceeds_the_threshold():
    got = moves_of(decide(hot_and_cold(), P, scaling=False))
    assert got and got[0].src == "h0" and got[0].dst == "h1" and got[0].gain_ms > 0


def test_no_move_when_the_gain_is_at_or_below_the_threshold():
    gain = moves_of(decide(hot_and_cold(), msgspec.structs.replace(P, max_moves_per_round=1), scaling=False))[0].gain_ms
    at = msgspec.structs.replace(P, gain_threshold_ms=gain)
    assert moves_of(decide(hot_and_cold(), at, scaling=False)) == []
    below = msgspec.structs.replace(P, gain_threshold_ms=gain * 0.999)
    assert len(moves_of(decide(hot_and_cold(), msgspec.structs.replace(below, max_moves_per_round=1),
                               scaling=False))) == 1


def test_no_move_between_balanced_hosts():
    f = fleet({"h0": [sess("a", "h0"), sess("b", "h0")], "h1": [sess("c", "h1"), sess("d", "h1")]})
    assert moves_of(decide(f, P, scaling=False)) == []


def test_an_inadmissible_path_refuses_the_move_with_the_reason_and_hope_would_have_taken_it():
    slow = PathRates(default_bps=admissibility.gbps(20))  # 8 GiB cannot cross 20 Gb/s within 2 s
    f = fleet({"h0": [sess(f"s{i}", "h0", state_bytes=8 << 30, dirty=0.2e9) for i in range(4)], "h1": []},
              paths=slow)
    d = decide(f, P, scaling=False)
    assert moves_of(d) == []
    assert d.refusals and all(r.kind == "move" and r.reason.startswith("inadmissible") for r in d.refusals)
    hoped_moves, _ = rebalance(Plan(f, P), admit=hoped)
    assert hoped_moves


def test_a_rounds_moves_share_no_receiver():
    hot = {h: [sess(f"{h}s{j}", h) for j in range(3)] for h in ("hot0", "hot1")}
    f = fleet(hot | {"c0": [], "c1": []}, background={"hot0": 0.3, "hot1": 0.05})
    got = moves_of(decide(f, msgspec.structs.replace(P, eta=0.0), scaling=False))
    assert len(got) == 2 and len({m.dst for m in got}) == 2


def test_a_host_receiving_an_in_flight_move_takes_no_other():
    f = fleet({"h0": [sess(f"s{i}", "h0") for i in range(4)], "h1": []})
    busy = msgspec.structs.replace(f, hosts=(f.hosts[0], msgspec.structs.replace(f.hosts[1], moves_in=1)))
    assert moves_of(decide(busy, P, scaling=False)) == []


def test_moves_per_session_per_window_stay_bounded_under_oscillating_load():
    """Load swings between two hosts every round; the same two sessions could chase it forever."""
    p = msgspec.structs.replace(P, move_cooldown_s=20.0, move_window_s=300.0, max_moves_per_window=2)
    where = {"a": "h0", "b": "h0"}
    history: dict[str, list[float]] = {"a": [], "b": []}
    for rnd in range(120):
        now = 1000.0 + 5.0 * rnd
        hot, cold = ("h0", "h1") if rnd % 2 == 0 else ("h1", "h0")
        on = {"h0": [], "h1": []}
        for sid, h in where.items():
            on[h].append(sess(sid, h, moves=tuple(t for t in history[sid] if t > now - p.move_window_s)))
        f = fleet(on, now=now, background={hot: 0.5, cold: 0.0})
        for m in moves_of(decide(f, p, scaling=False)):
            where[m.session_id] = m.dst
            history[m.session_id].append(now)
    for times in history.values():
        assert times, "the swing is worth moving for at least once"
        for t in times:
            assert sum(1 for u in times if t - p.move_window_s < u <= t) <= p.max_moves_per_window
        assert all(b - a >= p.move_cooldown_s for a, b in zip(times, times[1:], strict=False))


def test_no_move_whose_cut_over_chunk_would_become_the_new_worst():
    """With η = 0, Γ ignores the freeze; a slow path's freeze (85 ms) on top of the receiver's 30 ms would
    beat the 90 ms bottleneck the move is meant to relieve, so there is no move. A fast path moves."""
    p = msgspec.structs.replace(P, eta=0.0, move_horizon_s=600.0, max_moves_per_round=1)
    slow = PathRates(default_bps=admissibility.gbps(1))

    def hot(paths):
        return fleet({"h0": [sess(f"s{i}", "h0", dirty=0.1e9) for i in range(4)], "h1": []}, paths=paths)

    assert moves_of(decide(hot(slow), p, scaling=False)) == []
    assert len(moves_of(decide(hot(PathRates(default_bps=admissibility.gbps(100))), p, scaling=False))) == 1


def test_a_hosts_only_session_never_trades_places_with_an_equal_empty_host():
    """The heartbeat's load and a session's share are one number now (its floor at the host's costs), so
    moving a host's only session to an equal empty host moves the bottleneck without lowering it: no gain,
    even at η = 0 and a zero threshold. (Between unequal hosts it can: the service refuses those itself.)"""
    free = msgspec.structs.replace(P, eta=0.0)
    for floor in (4, 8, 16):
        assert moves_of(decide(fleet({"h0": [sess("a", "h0", floor=floor)], "h1": []}), free, scaling=False)) == []
    # a second session makes it a real gain: one each
    assert moves_of(decide(fleet({"h0": [sess("a", "h0"), sess("b", "h0")], "h1": []}), free, scaling=False))

