"""Property tests of the pure decision core: a state machine checks every decision near each log position
against the rules, and the invariants after every step; the race harness is checked to see a broken core."""

from __future__ import annotations

import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from bench import fence_race
from libs.errors import BadRequest, Conflict
from libs.fence import core
from libs.schemas.common import InputItem
from libs.schemas.fence import Assign, Claim, Close, Owner, Release, SessionView

SERVERS = ("a", "b", "c")
# Mostly the right server, version and seq, often one or two off. "owner" is the latest assign's server.
servers = st.sampled_from(("owner", "owner", *SERVERS))
near = st.sampled_from((0, 0, 0, -1, 1, -2, 2))


# ---------------------------------------------------------------- the rules, stated independently of the core


def latest(view: SessionView) -> int:
    return view.owner.version if view.owner else 0


def may_assign(view: SessionView, version: int) -> bool:
    return not view.closed and version == latest(view) + 1


def may_claim(view: SessionView, me: Owner, cursor: int) -> bool:
    return not view.closed and cursor >= 0 and me == view.owner and view.claim is None


def may_release(view: SessionView, to: Owner, first: int) -> bool:
    """Only to the latest assign's exact `(server_id, version)` once it claimed, from right after the cursor."""
    claimed = view.claim is not None and view.claim == view.owner
    return not view.closed and claimed and to == view.claim and first == view.released + 1


def items_from(first: int, n: int) -> list[InputItem]:
    return [InputItem(session_id="p", seq=first + i, kind="text", data=b'"x"') for i in range(n)]


def decides(allowed: bool, decide, *args):
    """The event `decide(*args)` returns, or None if it refused (with a typed error); either must match
    `allowed`."""
    try:
        event = decide(*args)
    except (Conflict, BadRequest):
        assert not allowed, "the core refused a decision the rules allow"
        return None
    assert allowed, f"the core accepted {event!r}, which the rules forbid"
    return event


class FenceCore(RuleBasedStateMachine):
    """Histories of one session built from attempts near the valid ones. At every position the core must
    decide every nearby assign, claim and release exactly as the rules above say, and the invariants must
    hold after every appended event."""

    def __init__(self) -> None:
        super().__init__()
        self.view = core.EMPTY
        self.log: list[tuple] = []  # (event, view before)

    def server(self, who: str) -> str:
        if who == "owner":
            return self.view.owner.server_id if self.view.owner else SERVERS[0]
        return who

    def attempt(self, allowed: bool, decide, *args) -> None:
        before = self.view
        event = decides(allowed, decide, before, *args)
        if event is not None:
            self.log.append((event, before))
            self.view = core.apply(before, event)
            check(self.log, self.view)

    @rule(who=servers, delta=near)
    def assign(self, who: str, delta: int) -> None:
        server, version = self.server(who), latest(self.view) + 1 + delta
        self.attempt(may_assign(self.view, version), core.decide_assign, server, version)

    @rule(who=servers, delta=near, cursor=st.integers(min_value=-1, max_value=6))
    def claim(self, who: str, delta: int, cursor: int) -> None:
        me = Owner(server_id=self.server(who), version=latest(self.view) + delta)
        self.attempt(may_claim(self.view, me, cursor), core.decide_claim, me.server_id, me.version, cursor)

    @rule(who=servers, delta=near, skip=near, n=st.integers(1, 3))
    def release(self, who: str, delta: int, skip: int, n: int) -> None:
        to = Owner(server_id=self.server(who), version=latest(self.view) + delta)
        first = self.view.released + 1 + skip
        self.attempt(may_release(self.view, to, first), core.decide_release, to, items_from(first, n))

    @rule(roll=st.integers(min_value=0, max_value=15))
    def close(self, roll: int) -> None:
        if roll == 0:  # a close ends the session's history: keep it rare so histories grow deep
            self.attempt(not self.view.closed, core.decide_close)

    @invariant()
    def every_nearby_decision_follows_the_rules(self) -> None:
        """The core is pure, so every candidate near this position can be tried without appending it."""
        view = self.view
        for server in SERVERS:
            for version in range(latest(view) - 1, latest(view) + 3):
                me = Owner(server_id=server, version=version)
                decides(may_assign(view, version), core.decide_assign, view, server, version)
                for cursor in (-1, 0, view.released):
                    decides(may_claim(view, me, cursor), core.decide_claim, view, server, version, cursor)
                for first in (view.released, view.released + 1, view.released + 2):
                    decides(may_release(view, me, first), core.decide_release, view, me, items_from(first, 2))


FenceCore.TestCase.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)
TestFenceCore = FenceCore.TestCase


def check(log, view: SessionView) -> None:
    event, before = log[-1]
    # Versions strictly increase, by one, and the claim is reset by every assign.
    assigns = [e.version for e, _ in log if isinstance(e, Assign)]
    assert assigns == list(range(1, len(assigns) + 1))
    if isinstance(event, Assign):
        assert view.claim is None and not before.closed
    # A claim is only ever the exact latest assign, once per assign.
    if isinstance(event, Claim):
        assert before.owner == Owner(server_id=event.server_id, version=event.version)
        assert before.claim is None
    # A release goes to the current claimed owner at that log position, starting right after the cursor.
    if isinstance(event, Release):
        assert core.current_owner(before) == Owner(server_id=event.server_id, version=event.version)
        assert [i.seq for i in event.items] == list(range(before.released + 1, before.released + 1 +
                                                          len(event.items)))
    # The host feed: from a claim up to and including the record that revokes it, every record is
    # addressed to the claimant's host, so a host reading only its own records misses nothing its lease needs.
    claimant = event if isinstance(event, Claim) else core.current_owner(before)
    if claimant is not None:
        assert core.addressee(before, event) == claimant.server_id
    # At most one incarnation is authorized at any position; nothing after a close.
    holders = {Owner(server_id=s, version=v) for s in SERVERS for v in range(1, len(assigns) + 2)
               if core.authorized(Owner(server_id=s, version=v), view)}
    assert len(holders) <= 1
    assert holders <= ({view.claim} if view.claim else set())
    if before.closed:
        raise AssertionError("an event was appended after close")
    assert not isinstance(event, Close) or view.closed


@given(st.integers(min_value=0, max_value=5))
def test_a_newer_assign_supersedes_an_unclaimed_one(n):
    view = core.EMPTY
    for v in range(1, n + 2):
        view = core.apply(view, core.decide_assign(view, "a" if v % 2 else "b", v))
    last = view.owner
    with pytest.raises(Conflict):
        core.decide_claim(view, last.server_id, last.version - 1 if last.version > 1 else 99, 0)
    view = core.apply(view, core.decide_claim(view, last.server_id, last.version, 0))
    assert core.authorized(last, view)


def test_bad_decisions_are_typed():
    view = core.apply(core.EMPTY, core.decide_assign(core.EMPTY, "a", 1))
    with pytest.raises(Conflict):
        core.decide_assign(view, "b", 1)  # non-increasing version
    with pytest.raises(Conflict):
        core.decide_claim(view, "b", 1, 0)  # not assigned
    with pytest.raises(BadRequest):
        core.decide_claim(view, "a", 1, -1)
    view = core.apply(view, core.decide_claim(view, "a", 1, 0))
    with pytest.raises(Conflict):
        core.decide_claim(view, "a", 1, 0)  # duplicate claim
    view = core.apply(view, core.decide_assign(view, "b", 2))
    with pytest.raises(Conflict):
        core.decide_claim(view, "a", 1, 0)  # stale claim
    item = InputItem(session_id="p", seq=1, kind="text", data=b'"x"')
    with pytest.raises(Conflict):
        core.decide_release(view, Owner(server_id="a", version=1), [item])  # revoked owner


def test_race_harness_full_protocol_never_conflicts_and_id_only_does():
    result = fence_race.run(3000, seed=12345)
    assert result["full"]["conflict_runs"] == 0
    assert result["id_only"]["conflict_runs"] > 0


def test_race_harness_catches_a_release_check_that_ignores_the_version(monkeypatch):
    """The harness is only evidence if it would see a broken core: weaken one check and it must."""
    real = core.decide_release
    monkeypatch.setattr(core, "decide_release",
                        lambda view, to, items, input_pos=0, protocol="full": real(view, to, items, input_pos,
                                                                                   "id_only"))
    assert fence_race.run(5000, seed=1)["full"]["conflict_runs"] > 0


def test_the_state_machine_catches_a_release_check_that_ignores_the_version(monkeypatch):
    """The machine is only evidence if it would see a broken core: make the release decision compare
    server ids alone and it must fail."""
    real = core.decide_release
    monkeypatch.setattr(core, "decide_release",
                        lambda view, to, items, input_pos=0, protocol="full": real(view, to, items, input_pos,
                                                                                   "id_only"))
    with pytest.raises(AssertionError, match="rules forbid"):
        run_state_machine_as_test(FenceCore, settings=settings(max_examples=200, stateful_step_count=40,
                                                               deadline=None, database=None,
                                                               phases=[Phase.generate]))


def test_race_harness_counts_a_stale_claim_as_a_conflict(monkeypatch):
    """A claim accepted at an old version is a broken fence even if no release follows it."""
    real = core.decide_claim
    monkeypatch.setattr(core, "decide_claim",
                        lambda view, server_id, version, cursor, protocol="full": real(view, server_id, version,
                                                                                       cursor, "id_only"))
    full = fence_race.run(3000, seed=1)["full"]
    assert full["conflict_runs"] > 0 and full["runs_by_kind"]["stale_claim"] > 0
