"""The move coordinator over a real nats-server, driving two real endpoints on DictHosts."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys

import pytest

from libs import bus, names
from libs.config import load
from libs.errors import StatefleetError
from libs.motion import crc
from libs.motion.endpoint import MotionEndpoint
from libs.motion.slot import SlotState
from libs.schemas.common import Ping, Pong
from libs.schemas.motion import MoveReceipt, MoveRequest, Verified
from services.fence.service import FenceConfig, FenceService
from services.mover.service import MoverConfig, MoverService
from tests.support.dicthost import DictHost, advance, make_tree, tree_bytes


@pytest.fixture
async def fence(nats_server):
    """The hand-over's assign goes through fence, the ownership log's only writer."""
    service = FenceService(FenceConfig(nats_url=nats_server.url_for("fence"), http_port=0, log_json=False))
    await service.start()
    yield service
    await service.stop()


@pytest.fixture
async def endpoints(nats_server, nc, fence):
    """Three hosts with their motion endpoints, and every receipt published; no coordinator yet."""
    hosts = {h: DictHost() for h in ("a", "b", "c")}
    eps = {h: MotionEndpoint(nc, h, host) for h, host in hosts.items()}
    for ep in eps.values():
        await ep.start()
    receipts: list[MoveReceipt] = []

    async def on_receipt(r: MoveReceipt) -> None:
        receipts.append(r)

    await bus.subscribe_events(nc, names.MOVE_RECEIPT_SUBJECTS, MoveReceipt, on_receipt)
    yield hosts, eps, receipts
    for ep in eps.values():
        await ep.stop()


@pytest.fixture
async def fleet(nats_server, endpoints):
    hosts, eps, receipts = endpoints
    cfg = load(MoverConfig, env={"SF_NATS_URL": nats_server.url_for("mover"), "SF_PRIOR_BANDWIDTH_BPS": "1e9",
                                 "SF_SETUP_S": "0.01", "SF_CHUNK_BYTES": "65536"})
    mover = MoverService(cfg)
    await mover.start()
    yield hosts, eps, mover, receipts
    await mover.stop()


async def spy(nc, verb: str) -> list[str]:
    """The subjects of every `verb` request sent to any host (a plain subscriber sees each one)."""
    seen: list[str] = []

    async def on_msg(msg) -> None:
        seen.append(msg.subject)

    await nc.subscribe(names.engine_subject("*", verb), cb=on_msg)
    return seen


async def move(nc, **kw) -> MoveReceipt:
    return await bus.request(nc, names.MOVER_MOVE, MoveRequest(**kw), MoveReceipt, timeout_s=30)


async def test_committed_move_is_bit_identical_and_continues_identically(nc, fleet):
    hosts, _, mover, receipts = fleet
    a, b = hosts["a"], hosts["b"]
    a.add("s1", make_tree(7), b"cursor=0")
    control = make_tree(7)
    for _ in range(3):
        assert await a.step("s1") == advance(control)
    want = tree_bytes(a.trees["s1"])
    r = await move(nc, session_id="s1", source="a", dest="b", deadline_s=10)
    assert r.outcome == "committed", r.reason
    assert tree_bytes(b.trees["s1"]) == want and "s1" not in a.trees
    assert b.descriptors["s1"] == b"cursor=0"
    assert r.state_bytes == sum(len(x) for x in want) and r.fingerprint and r.times.migrate_s > 0
    # The destination continues exactly like an unmigrated control of the same session...
    perturbed = make_tree(7)
    for _ in range(3):
        advance(perturbed)
    perturbed["latent"][:, 0] += 1e-3  # ...and a control whose state was nudged diverges.
    for _ in range(5):
        block = await b.step("s1")
        assert block == advance(control)
        assert block != advance(perturbed)
    await asyncio.sleep(0.1)
    assert [x.move_id for x in receipts] == [r.move_id]
    assert ("a", "b") in mover.planner.paths.rates


async def test_bandwidth_gate_rejects_with_reason_and_changes_nothing(nc, fleet):
    hosts, _, _, receipts = fleet
    hosts["a"].add("s1", make_tree(1))
    before = tree_bytes(hosts["a"].trees["s1"])
    # ~0.6 MB at the 1 GB/s prior needs ~0.6 ms plus 10 ms setup: a 5 ms horizon cannot hold it.
    r = await move(nc, session_id="s1", source="a", dest="b", deadline_s=0.005)
    assert r.outcome == "rejected" and "horizon" in r.reason
    assert tree_bytes(hosts["a"].trees["s1"]) == before and "s1" not in hosts["b"].trees
    await asyncio.sleep(0.1)
    assert receipts and receipts[-1].outcome == "rejected"


async def test_incast_duplex_and_unknown_session_are_rejected(nc, fleet):
    hosts, _, mover, _ = fleet
    for sid, h in (("s1", "a"), ("s2", "c"), ("s3", "b")):
        hosts[h].add(sid, make_tree(2))
    mover.planner.begin("held", MoveRequest(session_id="s0", source="a", dest="b", deadline_s=10))
    r = await move(nc, session_id="s2", source="c", dest="b", deadline_s=10)
    assert r.outcome == "rejected" and "incast" in r.reason
    r = await move(nc, session_id="s3", source="b", dest="a", deadline_s=10)
    assert r.outcome == "rejected" and "duplex" in r.reason
    mover.planner.end("held")


async def test_unknown_session_fails_at_the_source_and_touches_no_host(nc, fleet):
    """The source's register_state is the failing step: the move rolls back with its typed reason."""
    hosts, eps, _, _ = fleet
    admits = await spy(nc, "admit")
    r = await move(nc, session_id="nope", source="a", dest="b", deadline_s=10)
    assert (r.outcome, r.reason) == ("rolled_back", "not_found: no session nope")
    assert admits == [] and not eps["b"].slots and hosts["b"].installs == 0


async def test_destination_that_already_holds_the_session_declines(nc, fleet):
    hosts, _, _, _ = fleet
    hosts["a"].add("s1", make_tree(3))
    hosts["b"].add("s1", make_tree(4))
    r = await move(nc, session_id="s1", source="a", dest="b", deadline_s=10)
    assert r.outcome == "rejected" and "already holds" in r.reason
    assert hosts["b"].installs == 0


class GatedHost(DictHost):
    """Its second block boundary (migrate's, after register_state's) sets `at_gate` and waits until `gate`
    opens."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.at_gate = asyncio.Event()
        self.calls = 0

    @contextlib.asynccontextmanager
    async def _gated(self, session_id: str):
        self.calls += 1
        if self.calls >= 2:
            self.at_gate.set()
            await self.gate.wait()
        async with super().block_boundary(session_id):
            yield

    def block_boundary(self, session_id: str):
        self.state_tree(session_id)
        return self._gated(session_id)


async def test_destination_that_fails_verify_rolls_back_and_is_never_committed(nc, fleet):
    """A staged byte goes bad after it landed: verify says not ok, the coordinator rolls both sides back,
    reports it, and sends commit to no host."""
    hosts, eps, _, receipts = fleet
    source = GatedHost()
    source.add("s1", make_tree(6))
    ep = MotionEndpoint(nc, "g", source)
    await ep.start()
    before = tree_bytes(source.trees["s1"])
    verifies, commits = await spy(nc, "verify"), await spy(nc, "commit")
    try:
        task = asyncio.create_task(move(nc, session_id="s1", source="g", dest="b", deadline_s=30))
        await asyncio.wait_for(source.at_gate.wait(), 10)  # the destination armed its slot; migrate waits
        (slot,) = eps["b"].slots.values()
        source.gate.set()
        async with asyncio.timeout(10):
            await slot.done.wait()
        # Nothing else runs before this line (one event loop), so verify cannot come first: flip a staged
        # byte and record the CRC of what is staged now, as a receiver checking its own memory would.
        assert slot.state is SlotState.RECEIVED
        first = slot.flats[0][:min(slot.chunk_bytes, slot.flats[0].numel())]
        first[0] ^= 0xFF
        slot.record(0, 0, crc.crc_bytes(first))
        r = await task
        assert r.outcome == "rolled_back" and r.reason.startswith("integrity: destination verify failed:")
        assert verifies == [names.engine_subject("b", "verify")] and commits == []
        assert hosts["b"].installs == 0 and "s1" not in hosts["b"].trees and not eps["b"].slots
        assert not ep.outgoing and tree_bytes(source.trees["s1"]) == before
        await asyncio.wait_for(source.step("s1"), 5)  # thawed: the source runs on, authoritative
        await asyncio.sleep(0.1)
        assert [(x.move_id, x.outcome) for x in receipts] == [(r.move_id, "rolled_back")]
    finally:
        source.gate.set()
        await ep.stop()


async def test_coordinator_killed_mid_move_is_closed_out_by_the_next(nats_server, nc, endpoints):
    """SIGKILL a coordinator process while the source is mid-migrate; the next coordinator rolls it back."""
    hosts, eps, receipts = endpoints
    source = GatedHost()
    source.add("s1", make_tree(5))
    ep = MotionEndpoint(nc, "g", source)
    await ep.start()
    before = tree_bytes(source.trees["s1"])
    env = {**os.environ, "SF_NATS_URL": nats_server.url, "SF_SETUP_S": "0.01"}
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "statefleet", "serve", "mover", env=env,
                                                stdout=asyncio.subprocess.DEVNULL,
                                                stderr=asyncio.subprocess.DEVNULL)
    try:
        for _ in range(300):  # until the process answers its ping
            try:
                await bus.request(nc, "sf.mover.ping", Ping(), Pong, timeout_s=0.5)
                break
            except StatefleetError:
                await asyncio.sleep(0.1)
        task = asyncio.create_task(move(nc, session_id="s1", source="g", dest="b", deadline_s=60))
        await asyncio.wait_for(source.at_gate.wait(), 15)  # the destination armed its slot; migrate waits
        assert eps["b"].slots
        proc.kill()
        await proc.wait()
    finally:
        source.gate.set()
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    task.cancel()  # no reply will ever come from the killed process
    for _ in range(100):  # the source finishes sending into a slot nobody will verify
        if ep.outgoing:
            break
        await asyncio.sleep(0.05)
    second = MoverService(load(MoverConfig, env={"SF_NATS_URL": nats_server.url}))
    await second.start()
    try:
        for _ in range(200):  # its start-up closes out what the journal shows in flight (a moment, or more under load)
            closed = [r for r in receipts if r.session_id == "s1"]
            if closed:
                break
            await asyncio.sleep(0.05)
        assert closed and closed[-1].outcome == "rolled_back" and "restarted" in closed[-1].reason
        assert hosts["b"].installs == 0 and not eps["b"].slots and "s1" not in hosts["b"].trees
        assert tree_bytes(source.trees["s1"]) == before and not ep.outgoing
    finally:
        await second.stop()
        await ep.stop()


async def test_malformed_move_requests_get_typed_errors(nc, fleet):
    from libs.errors import SchemaError

    for bad in (dict(deadline_s=0.0), dict(deadline_s=-1.0), dict(dirty_rate_bps=-5.0), dict(session_id="")):
        req = dict(session_id="s1", source="a", dest="b", deadline_s=1.0) | bad
        with pytest.raises(SchemaError):
            await move(nc, **req)


class NaySayingEndpoint(MotionEndpoint):
    """A destination whose verify answers "not ok" although its slot verified: one that would install
    whatever a commit asks. Only the coordinator's own rule stands between it and a commit."""

    async def _on_verify(self, req):
        await super()._on_verify(req)
        return Verified(ok=False, reason="refused by this destination", staging="")


async def test_a_move_whose_verify_said_no_commits_nothing(nc, fleet):
    """The coordinator commits only after the destination's verify said ok (issue 22: a coordinator
    that committed after a failed verify was caught only by the receipt's reason string, since the
    real destination re-verifies on commit). Seen failing against that violation: the receipt said
    committed and the destination held the session."""
    hosts, _, _, receipts = fleet
    hosts["a"].add("s1", make_tree(5))
    before = tree_bytes(hosts["a"].trees["s1"])
    dest = DictHost()
    ep = NaySayingEndpoint(nc, "d", dest)
    await ep.start()
    try:
        r = await move(nc, session_id="s1", source="a", dest="d", deadline_s=30)
        assert r.outcome == "rolled_back"
        assert dest.installs == 0 and "s1" not in dest.trees and not ep.committed
        assert tree_bytes(hosts["a"].trees["s1"]) == before  # the source still holds it, authoritative
    finally:
        await ep.stop()
