"""The pure admission core: verdicts, the bounded FIFO, timeouts, reservations."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from libs.contracts import Contract, Demand, Guard
from services.admission.core import AdmissionCore, Candidate, Policy
from tests.support.fleet_rows import GIB, c1, host


def core(capacity: int = 3, timeout_s: float = 10.0, settle_s: float = 5.0, **guard) -> AdmissionCore:
    return AdmissionCore(Policy(guard=Guard(**guard), queue_capacity=capacity, queue_timeout_s=timeout_s,
                                settle_s=settle_s))


def cand(i: int, contract: Contract | None = None) -> Candidate:
    return Candidate(session_id=f"s{i}", backend="world", contract=contract or c1())


def admit(k: AdmissionCore, i: int, hosts, now: float = 1000.0, contract=None):
    """Submit and, if admitted, place it on the host the verdict names."""
    v = k.submit(cand(i, contract), hosts, now)
    if v.outcome == "admitted":
        e = v.estimates[0]
        k.placed(f"s{i}", e.host_id, Demand(busy_fraction=e.busy_fraction, state_bytes=e.state_bytes), now)
    return v


def test_admitted_verdict_carries_the_estimate_it_used():
    v = core().submit(cand(1), [host("h1", busy=0.5), host("h0", busy=0.85)], 1000.0)
    assert v.outcome == "admitted" and len(v.estimates) == 1
    e = v.estimates[0]
    assert (e.host_id, e.fits, e.busy_fraction, e.host_busy_fraction) == ("h1", True, 0.1, 0.5)


def test_reservations_stop_two_admissions_sharing_one_gap():
    k, hosts = core(), [host(busy=0.75)]  # room for one 0.1 session under the 0.9 limit
    assert admit(k, 1, hosts).outcome == "admitted"
    v = admit(k, 2, hosts)
    assert (v.outcome, v.reason, v.estimates[0].reason) == ("queued", "waiting_for_capacity", "busy")
    assert v.estimates[0].host_busy_fraction == 0.85  # measured 0.75 + our pending 0.1


def test_a_heartbeat_settle_s_after_placement_replaces_the_reservation():
    k = core(settle_s=5.0)
    admit(k, 1, [host(busy=0.75, at=1000.0)])
    # The host now measures the session itself (0.85), so the reservation must not count twice.
    v = k.submit(cand(2), [host(busy=0.75, at=1005.0)], 1006.0)
    assert v.outcome == "admitted"


def test_queue_is_bounded_and_a_full_queue_rejects_with_a_reason():
    k, full = core(capacity=2), [host(busy=0.85)]
    assert [k.submit(cand(i), full, 1000.0).queue_position for i in range(2)] == [1, 2]
    v = k.submit(cand(9), full, 1000.0)
    assert (v.outcome, v.reason, len(v.estimates)) == ("rejected", "queue_full", 1)
    assert [w.candidate.session_id for w in k.waiting()] == ["s0", "s1"]


def test_a_newcomer_never_overtakes_a_waiter():
    k = core()
    big = c1(period_ms=50.0, floor=16)  # 40 ms / 50 ms = 0.8 of a device
    assert k.submit(cand(1, big), [host(busy=0.3)], 1000.0).outcome == "queued"
    v = k.submit(cand(2), [host(busy=0.3)], 1000.0)  # would fit, but s1 is waiting
    assert (v.outcome, v.queue_position) == ("queued", 2)
    ready = k.head_ready([host(busy=0.05)])
    assert ready is not None and ready[0].session_id == "s1" and ready[1].outcome == "admitted"


def test_waiters_time_out_with_a_reason_and_are_not_dropped_silently():
    k = core(timeout_s=10.0)
    k.submit(cand(1), [host(busy=0.9)], 1000.0)
    k.submit(cand(2), [host(busy=0.9)], 1004.0)
    assert k.expire(1009.99) == []
    gone = k.expire(1010.0)
    assert [(c.session_id, v.outcome, v.reason) for c, v in gone] == [("s1", "timed_out", "queue_timeout")]
    assert k.next_deadline() == 1014.0 and k.position("s2") == 1


def test_head_stays_queued_until_placed():
    k = core()
    k.submit(cand(1), [host(busy=0.9)], 1000.0)
    assert k.head_ready([host(busy=0.9)]) is None
    assert k.head_ready([host()]) is not None and k.position("s1") == 1
    k.placed("s1", "h0", Demand(busy_fraction=0.1, state_bytes=GIB), 1001.0)
    assert k.position("s1") == 0 and k.head_ready([host()]) is None


def test_never_fits_is_rejected_at_once_not_queued():
    v = core().submit(cand(1, c1(period_ms=30.0, floor=16)), [host()], 1000.0)  # 40 ms every 30 ms
    assert (v.outcome, v.reason, v.estimates[0].reason) == ("rejected", "never_fits", "period")


def test_incoherent_contract_is_rejected_naming_fields():
    v = core().submit(cand(1, Contract(session_class="C4", quality_floor=4, determinism="T2")), [host()], 0.0)
    assert (v.outcome, v.reason, v.fields) == ("rejected", "incoherent_contract", ["session_class", "determinism"])


def test_no_live_host_rejects_naming_backend():
    v = core().submit(cand(1), [], 0.0)
    assert (v.reason, v.fields) == ("incoherent_contract", ["backend"])


def test_forget_removes_from_queue_and_reservations():
    k = core()
    admit(k, 1, [host(busy=0.75)])
    k.submit(cand(2), [host(busy=0.75)], 1000.0)
    assert k.forget("s1") and k.forget("s2") and not k.forget("s3")
    assert k.waiting() == [] and k.reservations.host_of("s1") is None


def test_slots_bound_sessions_per_host():
    k, hosts = core(max_sessions=2, capacity=0), [host()]
    assert [admit(k, i, hosts).outcome for i in range(3)] == ["admitted", "admitted", "rejected"]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["submit", "tick", "free"]), st.integers(0, 3)), max_size=60))
def test_invariants_under_random_traffic(ops):
    """Every candidate is accounted for exactly once: placed, queued, rejected or timed out.
    The queue never exceeds its bound, and placements never push a host past its guard."""
    k, now, load = core(capacity=4, timeout_s=3.0, settle_s=1e9), 0.0, {"h0": 0.0, "h1": 0.0}
    outcomes: dict[str, str] = {}
    for i, (op, n) in enumerate(ops):
        now += 1.0
        hosts = [host(h, busy=b, at=now) for h, b in load.items()]
        if op == "submit":
            contract = c1(period_ms=[20.0, 50.0, 100.0, 400.0][n])
            v = admit(k, i, hosts, now, contract)
            outcomes[f"s{i}"] = v.outcome
        elif op == "free":
            load = {h: max(0.0, b - 0.3) for h, b in load.items()}
        for c, v in k.expire(now):
            outcomes[c.session_id] = v.outcome
        while (ready := k.head_ready(hosts)) is not None:
            e = ready[1].estimates[0]
            k.placed(ready[0].session_id, e.host_id, Demand(busy_fraction=e.busy_fraction, state_bytes=0), now)
            outcomes[ready[0].session_id] = "admitted"
        assert len(k.waiting()) <= 4
        for h in hosts:
            assert h.busy_fraction + sum(d.busy_fraction for d in k.reservations.on(h)) <= 0.9 + 1e-9
    queued = {w.candidate.session_id for w in k.waiting()}
    assert queued == {s for s, o in outcomes.items() if o == "queued"}


def on(machine: str, h):
    import msgspec
    return msgspec.structs.replace(h, machine=machine, device="cpu")


def test_hosts_sharing_a_machines_cpu_split_it_rather_than_each_counting_all_of_it():
    """Two CPU hosts on one machine at 0.4 busy each: the CPU is at 0.8, so a 0.2 session fits neither
    (it would on either were they on two machines). Reservations on one count against the other."""
    k = core()
    shared = [on("m1", host("h0", busy=0.4)), on("m1", host("h1", busy=0.4))]
    assert k.submit(cand(1, c1(floor=8)), shared, 1000.0).outcome == "queued"
    apart = [on("m1", host("h0", busy=0.4)), on("m2", host("h1", busy=0.4))]
    assert core().submit(cand(1, c1(floor=8)), apart, 1000.0).outcome == "admitted"
    k = core()
    light = [on("m1", host("h0", busy=0.3)), on("m1", host("h1", busy=0.3))]  # 0.6 of 0.9: room for one 0.2
    assert admit(k, 1, light, contract=c1(floor=8)).outcome == "admitted"
    v = admit(k, 2, light, contract=c1(floor=8))
    assert v.outcome == "queued" and all(e.host_busy_fraction == 0.8 for e in v.estimates)
