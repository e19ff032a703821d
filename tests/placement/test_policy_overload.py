"""An overloaded device gives sessions up in order: moves first, then C3 and C2 suspended, then C1 re-queued."""

from __future__ import annotations

import msgspec

from libs import capacity_model as cm
from libs.contracts import Contract
from services.placement.policy.actions import Move, Requeue, Suspend
from services.placement.policy.overload import CAPACITY_LOST, device_load, kind_of, relieve
from services.placement.policy.plan import Plan
from tests.admission.test_capacity_model import capacity
from tests.placement.policy_fleet import PARAMS, fleet, sess

CAP = capacity({1: 20.0, 2: 25.0, 4: 30.0, 8: 40.0})  # world tier 4, ms per block at n co-located
C3 = Contract(session_class="C3", quality_floor=4, determinism="T2")
C2 = Contract(session_class="C2a", quality_floor=4, determinism="T1", deadline_ms=100.0)


def overloaded(room_elsewhere: bool):
    on_a = [sess(f"c1-{i}", "a0", floor=4) for i in range(4)]
    on_a += [msgspec.structs.replace(sess("c3", "a0", floor=4), contract=C3),
             msgspec.structs.replace(sess("c2", "a0", floor=4), contract=C2)]
    f = fleet({"a0": on_a, **({"b0": []} if room_elsewhere else {})})
    hosts = tuple(msgspec.structs.replace(h, entry=msgspec.structs.replace(
        h.entry, machine=h.host_id, device="cpu", capacity=CAP)) for h in f.hosts)
    return msgspec.structs.replace(f, hosts=hosts)


def test_a_device_over_its_measured_limit_moves_sessions_to_a_device_with_room_lower_classes_first():
    plan = Plan(overloaded(room_elsewhere=True), PARAMS)
    actions, _ = relieve(plan, PARAMS.guard)
    assert actions and all(isinstance(a, Move) and a.src == "a0" and a.dst == "b0" for a in actions)
    moved = [a.session_id for a in actions]
    assert moved[:2] == ["c3", "c2"]  # bulk and C2 give way before any C1 moves
    hl = plan.loads["a0"]
    left = [kind_of(s, hl) for s in hl.residents if s.session_id not in moved]
    assert device_load(CAP, left) <= 1 - PARAMS.guard.busy_fraction + 1e-9


def test_with_no_room_anywhere_c3_then_c2_are_suspended_before_a_c1_is_requeued_with_capacity_lost():
    f = overloaded(room_elsewhere=False)
    plan = Plan(f, PARAMS)
    actions, refusals = relieve(plan, PARAMS.guard)
    assert [type(a) for a in actions[:2]] == [Suspend, Suspend]
    assert [a.session_id for a in actions[:2]] == ["c3", "c2"]
    requeued = [a for a in actions if isinstance(a, Requeue)]
    assert requeued and all(a.reason == CAPACITY_LOST and a.session_id.startswith("c1-") for a in requeued)
    assert all(r.reason == "no_fit" for r in refusals)
    gone = {a.session_id for a in actions}
    hl = plan.loads["a0"]
    left = [kind_of(s, hl) for s in hl.residents if s.session_id not in gone]
    assert device_load(CAP, left) <= 1 - PARAMS.guard.busy_fraction + 1e-9
    assert cm.count(cm.merge(left)) >= 1  # no more given up than needed: the device keeps what it carries


def test_a_device_within_its_limit_is_left_alone():
    f = fleet({"a0": [sess("c1-0", "a0", floor=4)], "b0": []})
    hosts = tuple(msgspec.structs.replace(h, entry=msgspec.structs.replace(
        h.entry, machine=h.host_id, device="cpu", capacity=CAP)) for h in f.hosts)
    assert relieve(Plan(msgspec.structs.replace(f, hosts=hosts), PARAMS), PARAMS.guard) == ([], [])
