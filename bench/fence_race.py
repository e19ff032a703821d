"""Randomized ownership races through the fence's own decision core: full id+version vs id-only.

    python -m bench.fence_race [--quick] --json PATH

Each sequence is one session under random interleavings of: two controllers
assigning from stale views (concurrent reassignment, sometimes back to the same
server), assign notices and claims that arrive late, reordered or twice, two
gateways releasing from stale views, server crashes, and new input. Every
decision goes through `libs.fence.core` exactly as the service makes it; the
log's compare-and-set is modelled by deciding against the view the append
would find (what a lost CAS followed by a re-read amounts to).

A sequence has a conflict if, at some log position, a claim is accepted for a
`(server_id, version)` that is not the latest assign (a stale claim), or a
release is accepted for one that is not the current claimed owner (the latest
assign's `(server_id, version)` with its own claim: a stale release), whether or
not any engine then acts on it; or two incarnations hold the session (each
concluding from the log that it may take input); or a release is applied by an
incarnation that is not the current claimed owner; or an owner applies items out
of order. The same seeds run under both protocols.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from dataclasses import dataclass, field

from bench.common import parser, progress, table, write
from libs.errors import StatefleetError
from libs.fence import core
from libs.schemas.common import InputItem
from libs.schemas.fence import Claim, Owner, Release, SessionView

SERVERS = ("s0", "s1", "s2")
STEPS = 40
TARGET_FULL_CONFLICTS = 0


@dataclass
class Incarnation:
    owner: Owner
    cursor: int = 0  # the item its installed state reflects
    alive: bool = True
    claimed: bool = False
    revoked: bool = False
    applied: list[int] = field(default_factory=list)

    def holding(self, view: SessionView, protocol: core.Protocol) -> bool:
        return self.alive and self.claimed and not self.revoked and core.authorized(self.owner, view, protocol)


@dataclass
class Race:
    """One session's log and the actors around it."""

    rng: random.Random
    protocol: core.Protocol
    view: SessionView = core.EMPTY
    accepted: int = 0  # items stored by ingress
    controllers: list[SessionView] = field(default_factory=lambda: [core.EMPTY, core.EMPTY])
    gateways: list[SessionView] = field(default_factory=lambda: [core.EMPTY, core.EMPTY])
    notices: list[Owner] = field(default_factory=list)  # assign notices in flight (delayed, reordered)
    claims: list[Incarnation] = field(default_factory=list)  # claims in flight (late, duplicated)
    incarnations: list[Incarnation] = field(default_factory=list)
    conflicts: set[str] = field(default_factory=set)  # which invariants broke

    def append(self, event) -> None:
        """The event lands (it was decided against `self.view`); check the invariants at the new position."""
        before = self.view
        self.view = core.apply(before, event)
        truth = core.current_owner(before, "full")  # ground truth is the exact incarnation
        if isinstance(event, Claim) and Owner(server_id=event.server_id, version=event.version) != before.owner:
            self.conflicts.add("stale_claim")
        if isinstance(event, Release):
            if Owner(server_id=event.server_id, version=event.version) != truth:
                self.conflicts.add("stale_release")
            for inc in self.incarnations:
                if inc.alive and inc.claimed and not inc.revoked and core.accepts(inc.owner, event, self.protocol):
                    if inc.owner != truth:
                        self.conflicts.add("release_to_non_owner")
                    for item in event.items:
                        expected = (inc.applied[-1] if inc.applied else inc.cursor) + 1
                        if item.seq != expected:
                            self.conflicts.add("out_of_order")
                        inc.applied.append(item.seq)
        for inc in self.incarnations:
            if inc.claimed and core.revoked(inc.owner, self.view, self.protocol):
                inc.revoked = True
        if sum(inc.holding(self.view, self.protocol) for inc in self.incarnations) > 1:
            self.conflicts.add("two_holders")

    # -------------------------------------------------------------- actors

    def controller_reads(self) -> None:
        self.controllers[self.rng.randrange(2)] = self.view

    def controller_assigns(self) -> None:
        c = self.rng.randrange(2)
        seen = self.controllers[c]
        server = self.rng.choice(SERVERS)
        version = (seen.owner.version if seen.owner else 0) + 1
        try:
            event = core.decide_assign(self.view, server, version)
        except StatefleetError:
            self.controllers[c] = self.view  # lost the CAS: re-read
            return
        self.append(event)
        self.notices.append(Owner(server_id=server, version=version))

    def server_installs(self) -> None:
        """A server acts on an assign notice (any one in flight): installs state, sends its claim."""
        if not self.notices:
            return
        owner = self.notices.pop(self.rng.randrange(len(self.notices)))
        # Its state reflects a checkpoint at or before the release cursor it could see.
        inc = Incarnation(owner=owner, cursor=self.rng.randint(0, self.view.released))
        self.incarnations.append(inc)
        self.claims.append(inc)

    def claim_arrives(self) -> None:
        if not self.claims:
            return
        i = self.rng.randrange(len(self.claims))
        inc = self.claims[i] if self.rng.random() < 0.2 else self.claims.pop(i)  # 20%: a duplicate follows
        if not inc.alive:
            return
        try:
            event = core.decide_claim(self.view, inc.owner.server_id, inc.owner.version, inc.cursor,
                                      self.protocol)
        except StatefleetError:
            return
        inc.claimed = True
        self.append(event)

    def gateway_reads(self) -> None:
        self.gateways[self.rng.randrange(2)] = self.view

    def gateway_releases(self) -> None:
        g = self.rng.randrange(2)
        seen = self.gateways[g]
        seq = seen.released + 1
        if seq > self.accepted:
            return
        item = InputItem(session_id="race", seq=seq, kind="text", data=b'""')
        try:
            event = core.decide_release(self.view, core.current_owner(seen, self.protocol), [item],
                                        protocol=self.protocol)
        except StatefleetError:
            self.gateways[g] = self.view  # lost the CAS: re-read
            return
        self.append(event)
        self.gateways[g] = self.view

    def server_crashes(self) -> None:
        live = [inc for inc in self.incarnations if inc.alive]
        if live:
            self.rng.choice(live).alive = False

    def input_arrives(self) -> None:
        self.accepted += 1


ACTIONS = (
    (Race.controller_reads, 3), (Race.controller_assigns, 3), (Race.server_installs, 3),
    (Race.claim_arrives, 4), (Race.gateway_reads, 4), (Race.gateway_releases, 8),
    (Race.server_crashes, 1), (Race.input_arrives, 5),
)
_FUNCS = [a for a, _ in ACTIONS]
_WEIGHTS = [w for _, w in ACTIONS]


def run_sequence(seed: int, protocol: core.Protocol, steps: int = STEPS) -> set[str]:
    """One randomized sequence; the kinds of conflict it had (empty if none)."""
    rng = random.Random(seed)
    race = Race(rng, protocol)
    for action in rng.choices(_FUNCS, _WEIGHTS, k=steps):
        action(race)
    return race.conflicts


def run(sequences: int, seed: int = 0, *, show_progress: bool = False) -> dict:
    result: dict = {"sequences": sequences}
    for protocol in ("full", "id_only"):
        seeds = range(seed, seed + sequences)
        if show_progress:
            seeds = progress(seeds, sequences, protocol)
        start = time.perf_counter()
        runs, kinds = 0, Counter()
        for s in seeds:
            found = run_sequence(s, protocol)
            runs += bool(found)
            kinds.update(found)
        result[protocol] = {"conflict_runs": runs, "conflict_rate": runs / sequences,
                            "runs_by_kind": dict(kinds), "seconds": time.perf_counter() - start}
    return result


def main() -> None:
    args = parser("fence_race", __doc__.splitlines()[0]).parse_args()
    sequences = 10_000 if args.quick else 100_000
    result = run(sequences, show_progress=True)
    result["steps_per_sequence"] = STEPS
    result["targets"] = {"full.conflict_runs": TARGET_FULL_CONFLICTS, "id_only.conflict_runs": "> 0",
                         "published_id_only_rate": 0.14}
    table([
        ("sequences", sequences, "per protocol"),
        ("full.conflict_rate", result["full"]["conflict_rate"], "target 0"),
        ("id_only.conflict_rate", result["id_only"]["conflict_rate"], "target > 0 (published: 0.14)"),
    ])
    write(args.json, result)


if __name__ == "__main__":
    main()
