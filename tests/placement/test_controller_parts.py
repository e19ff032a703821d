"""The fleet controller built from config and fakes of its parts (tests/placement/parts.py): what it
applies, and what it leaves behind in reservations and fence's log, without a bus."""

from __future__ import annotations

import asyncio

import msgspec

from libs.errors import Timeout
from libs.schemas.engine import SessionInfo
from services.placement.policy import Move, Suspend
from tests.placement.parts import Parts
from tests.support.fleet_rows import host


def move(sid: str, src: str, dst: str) -> Move:
    return Move(session_id=sid, src=src, dst=dst, busy_fraction=0.1, state_bytes=1, gain_ms=10.0, t_migrate_s=0.1,
                stall_ms=1.0)


async def test_a_committed_move_keeps_only_the_receivers_reservation():
    parts = Parts([host("h0", busy=0.5), host("h1")])
    parts.owners.own("a", "h0")
    parts.reserved("h0", "a")
    parts.relocation.commits.add("a")
    fleet = parts.controller()
    assert await fleet.actions.move(move("a", "h0", "h1"))
    assert parts.reservations.holding("a") == {"h1"}
    assert await parts.owners.owner_is("a", "h1")


async def test_a_move_that_does_not_commit_keeps_only_the_sources_reservation():
    parts = Parts([host("h0", busy=0.5), host("h1")])
    parts.owners.own("a", "h0")
    parts.reserved("h0", "a")
    fleet = parts.controller()
    assert not await fleet.actions.move(move("a", "h0", "h1"))
    assert parts.reservations.holding("a") == {"h0"}
    assert await parts.owners.owner_is("a", "h0")
    assert parts.relocation.asked == [("a", "h0", "h1")]


async def test_a_move_to_a_full_receiver_is_not_asked_of_the_mover():
    parts = Parts([host("h0"), host("h1", busy=0.95)])
    parts.owners.own("a", "h0")
    parts.reserved("h0", "a")
    assert not await parts.controller().actions.move(move("a", "h0", "h1"))
    assert parts.relocation.asked == []
    assert parts.reservations.holding("a") == {"h0"}


async def test_a_host_is_released_only_when_fresh_reads_show_it_empty_and_it_is_fenced_drained():
    parts = Parts([host("h0"), host("h1")])
    fleet = parts.controller()
    assert await fleet.stoppable("h1") == "it is not draining"
    await parts.reservations.set_state("h1", "draining")
    parts.reserved("h1", "b")
    assert "reservations" in await fleet.stoppable("h1")
    await parts.reservations.unreserve("h1", ["b"])
    parts.owners.own("c", "h1")
    assert await fleet.stoppable("h1") == "it owns session c"
    parts.owners.own("c", "h0", 2)
    assert await fleet.stoppable("h1") == ""
    assert parts.reservations.record("h1").state == "drained"  # from now on nothing can be placed there


async def test_a_record_that_changed_after_the_checks_is_not_fenced():
    parts = Parts([host("h0"), host("h1")])
    await parts.reservations.set_state("h1", "draining")
    fleet = parts.controller()
    read = parts.reservations.read

    async def read_then_change(host_id: str):
        got = await read(host_id)
        await parts.reservations.set_state(host_id, "draining")  # another writer, after our read
        return got

    parts.reservations.read = read_then_change  # type: ignore[method-assign]
    assert await fleet.stoppable("h1") == "its record changed meanwhile"
    assert parts.reservations.record("h1").state == "draining"


def running(sid: str, cursor: int) -> SessionInfo:
    return SessionInfo(session_id=sid, backend="world", state="running", session_class="C1", tier=4, blocks_done=1,
                       input_cursor=cursor, consumed_seq=cursor, state_bytes=1 << 20)


async def test_a_round_suspends_a_session_idle_past_keep_warm_and_only_that_one():
    parts = Parts([host("h0", sessions=2), host("h1")], keep_warm_s=0.001, rebalance=False)
    for sid in ("a", "b"):
        parts.owners.own(sid, "h0")
    fleet = parts.controller()
    parts.engines.sessions = {"h0": [running("a", 1), running("b", 1)]}
    await fleet.round()  # first sight counts as input
    await asyncio.sleep(0.01)
    parts.engines.sessions = {"h0": [running("a", 1), running("b", 2)]}  # b took input
    decision = await fleet.round()
    assert Suspend(session_id="a", host_id="h0") in decision.actions
    await asyncio.gather(*list(fleet._tasks))
    assert parts.engines.suspended == [("h0", "a")]
    assert not fleet.busy


async def test_a_c1_session_no_device_can_keep_is_suspended_as_capacity_lost_and_its_summary_says_so():
    """The one host's device measured past its limit (1.0 > 0.9 + its margin) with nowhere to move: the round sheds its C1
    session as `capacity_lost`, suspends it on its host, and the summary `statefleet status` prints names why."""
    import msgspec

    over = msgspec.structs.replace(host("h0", busy=0.1, sessions=1), measured_fraction=1.0)
    parts = Parts([over], relieve_overload=True, rebalance=False)
    parts.owners.own("a", "h0")
    parts.engines.sessions = {"h0": [running("a", 1)]}
    fleet = parts.controller()
    decision = await fleet.round()
    assert Suspend(session_id="a", host_id="h0", reason="capacity_lost") in decision.actions
    await asyncio.gather(*list(fleet._tasks))
    assert parts.engines.suspended == [("h0", "a")]
    assert parts.engines.holding == ["a"]  # its host keeps its share priced: re-queued for that room
    summary = parts.view.summary["a"]
    assert summary.state == "suspended" and summary.reason.startswith("capacity_lost"), summary


async def test_a_capacity_lost_session_waits_while_its_device_is_measured_over_and_resumes_once_it_has_room():
    """Re-queued, not bouncing: the shed C1 session stays suspended while its device still measures past its
    limit (its input keeps coming), and resumes, input or not, once the device has room; the resume drops the
    summary's mark (fence then tells the client it is back). (No hold on its own device: `shed_hold_s` is
    tests/placement/test_policy_resume_measured.py's.)"""
    import msgspec

    over = msgspec.structs.replace(host("h0", busy=0.1, sessions=1), measured_fraction=1.0)
    parts = Parts([over], relieve_overload=True, rebalance=False, shed_hold_s=0.0)
    parts.owners.own("a", "h0")
    parts.engines.sessions = {"h0": [running("a", 1)]}
    fleet = parts.controller()
    await fleet.round()
    await asyncio.gather(*list(fleet._tasks))
    assert parts.view.summary["a"].shed == "capacity_lost"
    # the next heartbeat: the session suspended (no price), the device still measured past the limit
    parts.view.entries["h0"] = msgspec.structs.replace(over, busy_fraction=0.0, sessions=0, measured_fraction=0.93)
    parts.engines.sessions = {"h0": [msgspec.structs.replace(running("a", 2), state="suspended")]}
    decision = await fleet.round()
    assert not [a for a in decision.actions if type(a).__name__ == "Resume"]
    assert [(r.session_id, r.reason) for r in decision.refusals if r.kind == "resume"] == [("a", "measured_over_limit")]
    # the neighbour is gone: the device has room, and the re-queued session resumes without new input
    parts.view.entries["h0"] = msgspec.structs.replace(over, busy_fraction=0.0, sessions=0, measured_fraction=0.05)
    decision = await fleet.round()
    assert [(type(a).__name__, a.session_id, a.host_id) for a in decision.actions] == [("Resume", "a", "h0")]
    await asyncio.gather(*list(fleet._tasks))
    assert parts.engines.resumed == [("h0", "a")]
    assert ("a", 1, "resumed") in [(s, v, m) for s, v, m in parts.owners.marks]
    summary = parts.view.summary["a"]
    assert summary.state == "serving" and not summary.shed and not summary.reason, summary


def suspended(sid: str, cursor: int) -> SessionInfo:
    return msgspec.structs.replace(running(sid, cursor), state="suspended")


async def test_a_suspended_session_with_input_and_no_room_is_marked_waiting_though_no_shed_of_ours_put_it_there():
    """A session suspended on its host without a mark (a suspend whose reply came after the controller gave
    up on it; an idle offload) gets input while its device measures past its limit: the resume is refused,
    and the round marks it shed (`capacity_lost` for C1), so status and its client hear it waits. Before,
    it sat suspended with its input unapplied and told to nobody (bench.failover --hog 2, 2026-12-03)."""
    over = msgspec.structs.replace(host("h0", busy=0.0, sessions=0), measured_fraction=1.0)
    parts = Parts([over], relieve_overload=True, rebalance=False)
    parts.owners.own("a", "h0")
    parts.engines.sessions = {"h0": [suspended("a", 1)]}
    fleet = parts.controller()
    await fleet.round()  # first sight: suspended, no input since
    assert parts.owners.marks == [] and not parts.view.summary["a"].shed
    await asyncio.sleep(0.01)
    parts.engines.sessions = {"h0": [suspended("a", 2)]}  # input arrived
    decision = await fleet.round()
    assert [(r.session_id, r.kind) for r in decision.refusals if r.kind == "resume"] == [("a", "resume")]
    summary = parts.view.summary["a"]
    assert summary.shed == "capacity_lost" and summary.state == "suspended", summary
    assert "waiting for a device with room" in summary.reason
    await fleet.round()  # marked once, not at every round
    assert len(parts.owners.marks) == 1


async def test_a_resume_the_host_refuses_for_room_leaves_the_session_marked_waiting():
    """The policy saw room but the host's record did not (a reservation raced it): the resume fails, and
    the session that was suspended without a mark is marked waiting rather than left silent."""
    from libs.errors import Rejected

    parts = Parts([host("h0", busy=0.0, sessions=0)], relieve_overload=True, rebalance=False)
    parts.owners.own("a", "h0")
    parts.engines.sessions = {"h0": [suspended("a", 1)]}

    async def refuse(host_id: str, session_id: str) -> None:
        raise Rejected(f"host {host_id}: busy", host_id=host_id)

    parts.engines.resume = refuse  # type: ignore[method-assign]
    fleet = parts.controller()
    await fleet.round()
    await asyncio.sleep(0.01)
    parts.engines.sessions = {"h0": [suspended("a", 2)]}
    decision = await fleet.round()
    assert [(type(a).__name__, a.session_id) for a in decision.actions] == [("Resume", "a")]
    await asyncio.gather(*list(fleet._tasks))
    summary = parts.view.summary["a"]
    assert summary.shed == "capacity_lost" and "host h0: busy" in summary.reason, summary


class LateHost:
    """The engine host's side of a suspend or resume whose reply comes after the caller's timeout: the verb
    waits for the session's block boundary (`boundary`) and is done then, while the caller got `Timeout`."""

    def __init__(self, parts: Parts) -> None:
        self.engines = parts.engines
        self.boundary = asyncio.Event()
        self.done: list[asyncio.Task[None]] = []

    def verb(self, state: str):
        async def call(host_id: str, session_id: str, hold_share: bool = False) -> None:
            async def at_boundary() -> None:
                await self.boundary.wait()
                self.engines.sessions[host_id] = [msgspec.structs.replace(i, state=state)
                                                  if i.session_id == session_id else i
                                                  for i in self.engines.sessions[host_id]]

            self.done.append(asyncio.create_task(at_boundary()))
            raise Timeout(f"no reply on sf.engine.{host_id} within 5.0s")

        return call


async def test_a_shed_suspend_whose_reply_came_after_the_timeout_is_marked_once_the_host_shows_it_suspended():
    """The suspend timed out while the host still waited for a block boundary (still `running` when asked
    at once); the host suspended it afterwards. The next round's status read finds it suspended and marks it
    shed, so status and its client hear why. Before, it sat suspended with no mark, told to nobody."""
    over = msgspec.structs.replace(host("h0", busy=0.1, sessions=1), measured_fraction=1.0)
    parts = Parts([over], relieve_overload=True, rebalance=False)
    parts.owners.own("a", "h0")
    parts.engines.sessions = {"h0": [running("a", 1)]}
    late = LateHost(parts)
    parts.engines.suspend = late.verb("suspended")  # type: ignore[method-assign]
    fleet = parts.controller()
    decision = await fleet.round()
    assert Suspend(session_id="a", host_id="h0", reason="capacity_lost") in decision.actions
    await asyncio.gather(*list(fleet._tasks))
    assert parts.owners.marks == [] and not fleet.busy  # not suspended yet: nothing to say
    late.boundary.set()
    await asyncio.gather(*late.done)
    await fleet.round()
    summary = parts.view.summary["a"]
    assert summary.shed == "capacity_lost" and summary.state == "suspended", summary
    assert fleet.activity.seen["a"].suspended_at
    await fleet.round()
    assert len(parts.owners.marks) == 1  # finished once


async def test_a_suspend_the_host_did_before_the_late_check_is_finished_at_once():
    over = msgspec.structs.replace(host("h0", busy=0.1, sessions=1), measured_fraction=1.0)
    parts = Parts([over], relieve_overload=True, rebalance=False)
    parts.owners.own("a", "h0")
    parts.engines.sessions = {"h0": [running("a", 1)]}
    late = LateHost(parts)
    late.boundary.set()
    verb = late.verb("suspended")

    async def suspend(host_id: str, session_id: str, hold_share: bool = False) -> None:
        try:
            await verb(host_id, session_id)
        finally:
            await asyncio.gather(*late.done)  # done on the host before the caller asks how it stands

    parts.engines.suspend = suspend  # type: ignore[method-assign]
    fleet = parts.controller()
    await fleet.round()
    await asyncio.gather(*list(fleet._tasks))
    summary = parts.view.summary["a"]
    assert summary.shed == "capacity_lost" and summary.state == "suspended", summary
    assert not fleet.actions.unanswered


async def test_a_resume_whose_reply_came_after_the_timeout_drops_the_shed_mark_once_the_host_shows_it_running():
    """The shed session's resume timed out and the host resumed it afterwards: once a round sees it running,
    its mark goes (its client hears it is back), rather than a serving session staying marked as waiting."""
    parts = Parts([host("h0", busy=0.0, sessions=0)], relieve_overload=True, rebalance=False, shed_hold_s=0.0)
    parts.owners.own("a", "h0")
    await parts.owners.mark("a", 1, shed_kind="capacity_lost", shed="capacity_lost: h0's device measured past its limit")
    parts.engines.sessions = {"h0": [suspended("a", 1)]}
    late = LateHost(parts)
    parts.engines.resume = late.verb("running")  # type: ignore[method-assign]
    fleet = parts.controller()
    decision = await fleet.round()  # a re-queued capacity_lost session resumes once its device has room
    assert [(type(a).__name__, a.session_id) for a in decision.actions] == [("Resume", "a")]
    await asyncio.gather(*list(fleet._tasks))
    assert parts.view.summary["a"].shed == "capacity_lost"
    late.boundary.set()
    await asyncio.gather(*late.done)
    await fleet.round()
    summary = parts.view.summary["a"]
    assert summary.state == "serving" and not summary.shed, summary
    assert ("a", 1, "resumed") in parts.owners.marks
