"""A restarted engine-host process inherits nothing: its predecessor's sessions fail over (issue 22).

The invariant: once a host id beats with a new incarnation, a session fence shows owned by the old
incarnation is stranded, and one sweep reassigns it, so the old incarnation is not its owner any
more (the new process can claim only an assign that names it). A mutation campaign's "restarted
incarnation keeps its predecessor's sessions" was caught only by the whole-stack crash test timing
out; this sweep, built from the real liveness and fakes of the other parts, was seen failing against
it (`Liveness.owner_alive` taking any incarnation of a live host id for alive).
"""

from __future__ import annotations

import time

import msgspec
import structlog

from libs.schemas.common import SessionSummary
from services.placement.liveness import Liveness
from services.placement.sweeper import Sweeper
from tests.placement.parts import GUARD, Parts
from tests.placement.parts import Owners as FakeOwners
from tests.support.fleet_rows import host


class Owners(FakeOwners):
    """The fakes' fence log, with the incarnation an assign names kept in the view (as fence keeps it)."""

    async def assign(self, session_id: str, host_id: str, *, expect_version: int, incarnation: str) -> None:
        await super().assign(session_id, host_id, expect_version=expect_version, incarnation=incarnation)
        self.views[session_id] = msgspec.structs.replace(self.views[session_id], incarnation=incarnation)


async def test_a_restarted_process_does_not_keep_its_predecessors_sessions():
    parts = Parts([host("h1"), host("h2")])
    now = time.monotonic()
    liveness = Liveness(unknown_grace_s=3600.0)  # an unseen incarnation is never taken for dead by waiting
    for h in ("h1", "h2"):
        liveness.observe(msgspec.structs.replace(parts.view.entries[h], incarnation=f"{h}-a", heartbeat_s=3600.0),
                         now)
    parts.view.liveness = liveness  # type: ignore[attr-defined]
    parts.view.entries = {e.host_id: e for e in liveness.hosts()}
    owners = parts.reservations.owners = Owners(parts.view)
    owners.own("s1", "h1")
    owners.views["s1"] = msgspec.structs.replace(owners.views["s1"], incarnation="h1-a")
    parts.view.summary["s1"] = SessionSummary(session_id="s1", owner_server_id="h1", owner_version=1,
                                              owner_incarnation="h1-a", claimed=True, state="serving")
    sweeper = Sweeper(view=parts.view, owners=owners, reservations=parts.reservations,  # type: ignore[arg-type]
                      guard=GUARD, config=parts.config, settle_s=5.0, grace_s=3600.0, log=structlog.get_logger("test"))

    await sweeper.sweep()
    assert owners.views["s1"].incarnation == "h1-a"  # nothing changed: its process is alive

    restarted = msgspec.structs.replace(parts.view.entries["h1"], incarnation="h1-b", heartbeat_s=3600.0)
    deaths = liveness.observe(restarted, time.monotonic())
    assert [(d.host_id, d.incarnation, d.reason) for d in deaths] == [("h1", "h1-a", "new_incarnation")]
    parts.view.entries["h1"] = restarted
    await sweeper.sweep()
    view = owners.views["s1"]
    assert view.owner is not None and view.owner.version == 2
    assert (view.owner.server_id, view.incarnation) != ("h1", "h1-a")  # the old incarnation owns nothing
    assert view.incarnation in ("h1-b", "h2-a")  # assigned to a live process, named
