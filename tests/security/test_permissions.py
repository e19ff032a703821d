"""Bus security on a real nats-server configured as `statefleet up` configures it: each service
connects as its own user and is refused what it has no business doing; anonymous clients are refused
outright. Every refusal is shown both ways: the server reports a permissions violation, and nothing
of what was attempted landed (a positive control shows the same action succeeds for its owner)."""

from __future__ import annotations

import asyncio
import contextlib

import msgspec
import nats
import nats.errors
import pytest

from libs import bus, bus_auth, errors, names
from libs.fence import block_journal, ownership
from libs.fence.client import EngineClient
from libs.schemas.base import decode, encode
from libs.schemas.common import SessionSummary
from libs.schemas.fence import (
    AssignNotice,
    BlockEntry,
    Claim,
    LogRecord,
    MarkReply,
    MarkRequest,
    Owner,
    RegisterReply,
    RegisterRequest,
    SessionView,
)
from services.admission.fleet_feed import FleetFeed
from tests.support.fence import start_fence


class Probe:
    """A raw connection as one user, collecting the server's permission errors."""

    def __init__(self) -> None:
        self.violations: list[str] = []
        self.nc: nats.NATS

    async def connect(self, server, user: str) -> Probe:
        cred = server.credentials[user]

        async def on_error(e: Exception) -> None:
            if "permissions violation" in str(e).lower():
                self.violations.append(str(e))

        self.nc = await nats.connect(server.plain_url, user=cred.user, password=cred.password,
                                     inbox_prefix=names.inbox_prefix(cred.user), error_cb=on_error,
                                     max_reconnect_attempts=0)
        return self

    async def refused(self, what: str, timeout_s: float = 3.0) -> None:
        """Wait for the server to report a violation whose text contains `what`."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while not any(what.lower() in v.lower() for v in self.violations):
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"no permissions violation for {what!r}; got {self.violations}")
            await asyncio.sleep(0.02)


@pytest.fixture
async def probes(nats_server):
    opened: list[Probe] = []

    async def as_user(user: str) -> Probe:
        p = await Probe().connect(nats_server, user)
        opened.append(p)
        return p

    yield as_user
    for p in opened:
        with contextlib.suppress(Exception):
            await p.nc.close()


@pytest.fixture
async def fence_as_fence(nats_server):
    service = await start_fence(nats_server.url_for("fence"), "fence-secure")
    yield service
    await service.stop()


async def test_anonymous_and_wrong_password_are_refused(nats_server):
    with pytest.raises(errors.Unavailable):
        await bus.connect(nats_server.plain_url, name="anonymous", connect_timeout_s=1.0)
    wrong = bus_auth.Credential("fence", "not-the-password")
    with pytest.raises(errors.Unavailable):
        await bus.connect(bus_auth.url_with(nats_server.plain_url, wrong), name="guess", connect_timeout_s=1.0)


async def test_only_fence_appends_to_the_ownership_log(nats_server, fence_as_fence, probes):
    admission = await probes("admission")
    cli = await bus.connect(nats_server.url, name="cli")
    try:
        js = cli.jetstream()
        # A direct append by admission is refused by the server and lands nothing ...
        await admission.nc.publish(names.session_record_subject("x", "e0"), b"forged")
        await admission.refused(f'Publish to "{names.session_record_subject("x", "e0")}"')
        info = await js.stream_info(names.SESSION_STREAM)
        assert info.state.messages == 0
        # ... while the same intent through fence's verb is allowed and written by fence.
        admission_nc = await bus.connect(nats_server.url_for("admission"), name="admission")
        try:
            await bus.request(admission_nc, names.FENCE_REGISTER,
                              RegisterRequest(session_id="x", backend="toy", seed=1), RegisterReply)
            a = await ownership.assign(admission_nc, "x", "e0")
            assert a.version == 1
            stale = ownership.assign(admission_nc, "x", "e1", expect_version=0)
            with pytest.raises(errors.Conflict):
                await stale
            assert (await ownership.read_owner(js, "x")).view.owner.server_id == "e0"
        finally:
            await admission_nc.close()
        for user in ("placement", "mover", "engine.e0"):
            p = await probes(user)
            await p.nc.publish(names.INPUT_SUBJECTS.replace(">", "x"), b"forged input")
            await p.refused('Publish to "sf.input.x"')
        assert (await js.stream_info(names.INPUT_STREAM)).state.messages == 0
    finally:
        await cli.close()


async def test_no_client_reads_another_clients_replies(nats_server, fence_as_fence, probes):
    """Register replies carry input tokens: admission's inbox is admission's alone."""
    thief = await probes("placement")
    for pattern in ("_INBOX.>", f"{names.inbox_prefix('admission')}.>", ">"):
        sub = await thief.nc.subscribe(pattern)
        await thief.refused(f'Subscription to "{pattern}"')
        with contextlib.suppress(Exception):
            await sub.unsubscribe()
    stolen: list[bytes] = []

    async def steal(m) -> None:
        stolen.append(m.data)

    for user in ("mover", "engine.e0"):  # a subscription that would see the token if it were allowed
        p = await probes(user)
        await p.nc.subscribe(f"{names.inbox_prefix('admission')}.>", cb=steal)
        await p.refused("Subscription to")
    admission = await bus.connect(nats_server.url_for("admission"), name="admission")
    try:
        reply = await bus.request(admission, names.FENCE_REGISTER,
                                  RegisterRequest(session_id="tok", backend="toy", seed=1), RegisterReply)
    finally:
        await admission.close()
    await asyncio.sleep(0.2)
    assert reply.token and not stolen
    # The same subscription by a user allowed to make it (the operator) does see the reply: the
    # refusal above, not an absence of traffic, is what kept the token from the others.
    cli = await bus.connect(nats_server.url, name="cli")
    try:
        await cli.subscribe(f"{names.inbox_prefix('admission')}.>", cb=steal)
        await cli.flush()
        admission = await bus.connect(nats_server.url_for("admission"), name="admission")
        try:
            again = await bus.request(admission, names.FENCE_REGISTER,
                                      RegisterRequest(session_id="tok2", backend="toy", seed=1), RegisterReply)
        finally:
            await admission.close()
        await asyncio.sleep(0.2)
        assert any(again.token.encode() in m for m in stolen)
    finally:
        await cli.close()


async def test_an_engine_host_speaks_only_for_itself(nats_server, probes):
    e0 = await probes("engine.e0")
    # Its own verbs: served. Another host's verbs, notices and heartbeat key: refused.
    await e0.nc.subscribe(names.engine_subject("e0", "ping"))
    await e0.nc.subscribe(names.engine_subject("e1", "ping"))
    await e0.refused(f'Subscription to "{names.engine_subject("e1", "ping")}"')
    notice = AssignNotice(session_id="s", server_id="e1", version=9, log_seq=1)
    await e0.nc.publish(names.assigned_subject("e1"), encode(notice))
    await e0.refused(f'Publish to "{names.assigned_subject("e1")}"')
    await e0.nc.publish(f"$KV.{names.ENGINES_BUCKET}.e1", b"forged heartbeat")
    await e0.refused(f'Publish to "$KV.{names.ENGINES_BUCKET}.e1"')
    await e0.nc.publish(f"$KV.{names.FENCE_META_BUCKET}.s", b"forged meta")
    await e0.refused(f'Publish to "$KV.{names.FENCE_META_BUCKET}.s"')
    assert not any(names.engine_subject("e0", "ping") in v.lower() for v in e0.violations)


async def test_an_engine_claims_only_through_fence(nats_server, fence_as_fence, probes):
    """An engine host's own append to the session log is refused; its claim through `sf.fence.claim`
    lands, written by fence."""
    admission = await bus.connect(nats_server.url_for("admission"), name="admission")
    engine = await bus.connect(nats_server.url_for("engine_host", "e0"), name="engine.e0")
    client = EngineClient(engine, engine.jetstream(), "e0")
    try:
        await bus.request(admission, names.FENCE_REGISTER, RegisterRequest(session_id="c", backend="toy", seed=1),
                          RegisterReply)
        assigned = await ownership.assign(admission, "c", "e0")
        e0 = await probes("engine.e0")
        forged = LogRecord(event=Claim(server_id="e0", version=assigned.version, cursor=0),
                           view=SessionView(owner=Owner(server_id="e0", version=assigned.version)))
        await e0.nc.publish(names.session_record_subject("c", "e0"), encode(forged))
        await e0.refused(f'Publish to "{names.session_record_subject("c", "e0")}"')
        assert (await ownership.read_owner(engine.jetstream(), "c")).view.claim is None
        await client.start()
        lease = await client.claim("c", assigned.version, cursor=0)
        tail = await ownership.read_owner(engine.jetstream(), "c")
        assert tail.view.claim == lease.owner and tail.seq == lease.read_after
    finally:
        await client.close()
        await engine.close()
        await admission.close()


async def test_jetstream_api_is_scoped_per_service(nats_server, fence_as_fence, probes):
    """Admission may not delete the ownership log or read the input stream; fence's streams stay."""
    admission = await probes("admission")
    js = admission.nc.jetstream(timeout=1.0)
    with pytest.raises(nats.errors.TimeoutError):
        await js.delete_stream(names.SESSION_STREAM)
    await admission.refused(f'Publish to "$JS.API.STREAM.DELETE.{names.SESSION_STREAM}"')
    with pytest.raises(nats.errors.TimeoutError):
        await js.stream_info(names.INPUT_STREAM)
    await admission.refused(f'Publish to "$JS.API.STREAM.INFO.{names.INPUT_STREAM}"')
    cli = await bus.connect(nats_server.url, name="cli")
    try:
        assert (await cli.jetstream().stream_info(names.SESSION_STREAM)).config.name == names.SESSION_STREAM
    finally:
        await cli.close()


async def test_admission_follows_moves_in_flight_and_their_receipts(nats_server, probes):
    """The dashboard's feed, run as admission, sees the mover's in-flight journal and its receipts:
    no STREAM.INFO refusal on the mover's bucket, no refused subscription to receipts."""
    mover = await probes("mover")
    journal = await bus.ensure_kv(mover.nc.jetstream(), names.MOVES_INFLIGHT_BUCKET)
    await journal.put("m1", msgspec.msgpack.encode({"session_id": "s1", "source": "e0", "dest": "e1"}))
    admission = await probes("admission")
    feed = FleetFeed(admission.nc, admission.nc.jetstream(timeout=2.0), queue=lambda: None, heartbeat_s=0.2)
    tasks: list[asyncio.Task] = []
    await feed.start(lambda coro, _name: tasks.append(asyncio.create_task(coro)))
    try:
        await admission.nc.flush()  # its receipt subscription is at the server before the mover publishes
        receipt = msgspec.msgpack.encode({"session_id": "s1", "outcome": "committed"})
        deadline = asyncio.get_running_loop().time() + 10.0
        while not (feed.inflight and feed.receipts):
            assert asyncio.get_running_loop().time() < deadline, (feed.inflight, feed.receipts, admission.violations,
                                                                  mover.violations)
            if not feed.receipts:  # receipts are core NATS (at most once): one a CI run never saw is sent again
                await mover.nc.publish(names.move_receipt_subject("s1"), receipt)
                await mover.nc.flush()
            await asyncio.sleep(0.1)
        assert feed.inflight["m1"]["dest"] == "e1"
        assert not admission.violations
    finally:
        feed.stop()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def test_only_fence_may_put_into_the_sessions_hint(nats_server, fence_as_fence, probes):
    """`sf_sessions` is written by fence only (a new session's first summary, one after each append, and
    placement's orphan marks, asked for with `sf.fence.mark`); engine hosts, the mover and placement only read it."""
    for user in ("engine.e0", "mover", "placement"):
        p = await probes(user)
        await p.nc.publish(f"$KV.{names.SESSIONS_BUCKET}.s", b"forged summary")
        await p.refused(f'Publish to "$KV.{names.SESSIONS_BUCKET}.s"')
    # The positive control: placement's orphan mark, asked of fence, lands (written by fence).
    admission = await bus.connect(nats_server.url_for("admission"), name="admission")
    placement = await bus.connect(nats_server.url_for("placement"), name="placement")
    try:
        await bus.request(admission, names.FENCE_REGISTER, RegisterRequest(session_id="s", backend="toy", seed=1),
                          RegisterReply)
        assigned = await ownership.assign(admission, "s", "e0")
        reply = await bus.request(placement, names.FENCE_MARK, MarkRequest(
            session_id="s", version=assigned.version, orphaned="waiting for room (no live host)"), MarkReply)
        assert reply.state == "orphaned"
        kv = await placement.jetstream().key_value(names.SESSIONS_BUCKET)
        assert decode((await kv.get("s")).value, SessionSummary).state == "orphaned"
    finally:
        await placement.close()
        await admission.close()


async def test_admission_only_reads_the_sessions_hint(nats_server, fence_as_fence, probes):
    """Fence writes a new session's first summary as it registers it (issue 22: one writer fewer), so
    admission's user may read `sf_sessions` and not put into it."""
    p = await probes("admission")
    await p.nc.publish(f"$KV.{names.SESSIONS_BUCKET}.s", b"forged summary")
    await p.refused(f'Publish to "$KV.{names.SESSIONS_BUCKET}.s"')


async def test_placement_reads_a_block_journals_threads_and_writes_none(nats_server, fence_as_fence, probes):
    """Failover and drain prefer a host at the torch threads a stranded session's blocks ran at, read from
    its block journal's tail (`recorded_threads`): placement's user may read the journal (a refused direct
    get only times out, stalling every failover by the request timeout) and may not append to it."""
    engine = await probes("engine.e0")
    entry = BlockEntry(server_id="e0", version=1, threads=3)
    await engine.nc.jetstream().publish(names.block_journal_subject("s"), encode(entry))
    placement = await probes("placement")
    assert await block_journal.recorded_threads(placement.nc.jetstream(timeout=2.0), "s") == 3
    assert not placement.violations
    await placement.nc.publish(names.block_journal_subject("s"), encode(entry))
    await placement.refused(f'Publish to "{names.block_journal_subject("s")}"')
