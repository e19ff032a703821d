"""Property tests of the pure decision core: arbitrary attempts, invariants checked after every step."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench import fence_race
from libs.errors import BadRequest, Conflict, StatefleetError
from libs.fence import core
from libs.schemas.common import InputItem
from libs.schemas.fence import Assign, Claim, Close, Owner, Release, SessionView

servers = st.sampled_from(["a", "b", "c"])
versions = st.integers(min_value=-1, max_value=8)
attempts = st.one_of(
    st.tuples(st.just("assign"), servers, versions),
    st.tuples(st.just("claim"), servers, versions, st.integers(min_value=-1, max_value=6)),
    st.tuples(st.just("release"), servers, versions, st.integers(min_value=0, max_value=8), st.integers(1, 3)),
    st.tuples(st.just("close")),
)


def attempt(view: SessionView, a: tuple):
    if a[0] == "assign":
        return core.decide_assign(view, a[1], a[2])
    if a[0] == "claim":
        return core.decide_claim(view, a[1], a[2], a[3])
    if a[0] == "release":
        items = [InputItem(session_id="p", seq=a[3] + i, kind="text", data=b'"x"') for i in range(a[4])]
        return core.decide_release(view, Owner(server_id=a[1], version=a[2]), items)
    return core.decide_close(view)


@settings(max_examples=400, deadline=None)
@given(st.lists(attempts, max_size=40))
def test_invariants_hold_after_every_step(seq):
    view = core.EMPTY
    log: list[tuple] = []  # (event, view before)
    for a in seq:
        try:
            event = attempt(view, a)
        except StatefleetError as e:
            assert isinstance(e, (Conflict, BadRequest))  # typed, and the view is untouched
            continue
        log.append((event, view))
        view = core.apply(view, event)
        check(log, view)


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
    # At most one incarnation is authorized at any position; nothing after a close.
    holders = {Owner(server_id=s, version=v) for s in "abc" for v in range(1, 9)
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
