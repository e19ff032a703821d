"""Idle offload and resume.

A serving session with no input for `keep_warm_s` is suspended: its state leaves the device
for its host's memory, freeing device capacity. A suspended session that has had input since
it was suspended resumes on its old host when that host has room, else wherever placement
would put it (the pre-warmed pool is part of that). The frontend sees a resume delay. A C1
session overload relief shed as `capacity_lost` is re-queued: it resumes as soon as a device
has room, input or not, and before the others. Every resume needs room on the device's
measured load too (`overload.MeasuredRoom`), not only in its prices.
"""

from __future__ import annotations

from libs.contracts import device_key
from services.placement.policy import latency
from services.placement.policy.actions import Refusal, Resume, Suspend
from services.placement.policy.overload import MeasuredRoom
from services.placement.policy.placement import Placer, resume
from services.placement.policy.plan import HostLoad, Plan
from services.placement.policy.snapshot import Session


def wants_resume(plan: Plan) -> list[Session]:
    return [s for s in plan.suspended if s.shed == "capacity_lost" or s.last_input_at > s.suspended_at]


def resumes(plan: Plan, placer: Placer) -> tuple[list[Resume], list[Refusal]]:
    done: list[Resume] = []
    refused: list[Refusal] = []
    room = MeasuredRoom(plan)
    for s in sorted(wants_resume(plan), key=lambda x: (x.shed != "capacity_lost", x.last_input_at, x.session_id)):
        r = resume(placer, s, among=lambda hl, s=s: room.admits(s, hl) and not _sibling(plan, s, hl)
                   and not _held(plan, s, hl))
        if isinstance(r, Resume):
            room.add(s, plan.loads[r.host_id])
            done.append(r)
        else:
            refused.append(r)
    return done, refused


def _held(plan: Plan, s: Session, hl: HostLoad) -> bool:
    """`hl` is on the device `s` was shed from as `capacity_lost` less than `shed_hold_s` ago (`Params`)."""
    old = plan.loads.get(s.host_id)
    if s.shed != "capacity_lost" or old is None or plan.fleet.now - s.suspended_at >= plan.params.shed_hold_s:
        return False
    return device_key(hl.host.entry) == device_key(old.host.entry)


def _sibling(plan: Plan, s: Session, hl: HostLoad) -> bool:
    """`hl` is another process of the device `s` was suspended from, which is still open: `s` resumes on
    its own process or on another device. Back on a sibling it would free nothing its device lacked (one
    device, one measured load) and split the device's sessions over two processes, which costs the
    device more stage time per block (docs/bench-colocation.md); the sibling only looked cheaper
    because the controller's snapshot prices each process alone."""
    old = plan.loads.get(s.host_id)
    if old is None or not old.open or hl is old:
        return False
    return device_key(hl.host.entry) == device_key(old.host.entry)


def resumes_within_cap(plan: Plan, s: Session) -> bool:
    """With a latency cap: would this session's resume stay within it wherever it lands? Its first chunk
    after the copy back to the device may come on a host packed to the target, so the copy must fit in
    what the cap leaves above the target. A suspend whose resume cannot is not made: that resume would
    be a chunk past the cap. (Predicting the chunk alone let small-state sessions suspend, and their
    resumes onto busy hosts, or after waiting for room, passed the cap.)"""
    p = plan.params
    if p.latency_cap_ms <= 0:
        return True
    hl = plan.loads.get(s.host_id)
    t = plan.term(s, hl) if hl is not None else None
    if t is None:
        return False
    return latency.target_ms(p, t) + 1e3 * s.state_bytes / p.resume_bps <= p.latency_cap_ms


def suspends(plan: Plan) -> list[Suspend]:
    out = []
    for s in sorted(plan.idle, key=lambda x: x.session_id):
        if s.session_id not in plan.claimed and resumes_within_cap(plan, s):
            hl = plan.loads.get(s.host_id)
            if hl is not None and s.session_id in plan.open_up(hl):
                plan.take_away(s, hl)
            plan.claimed.add(s.session_id)
            out.append(Suspend(session_id=s.session_id, host_id=s.host_id))
    return out
