"""The session runtime: input order, bad input changes nothing, failures stay contained,
suspend/resume and the mover's host endpoint are bit-exact."""

from __future__ import annotations

import asyncio
import json

import pytest
import torch

from libs.checkpoint import clone_tree, trees_equal
from libs.contracts import MEASURE_WINDOW_S
from libs.errors import BadRequest, Busy, Conflict, NotFound, SchemaError
from libs.schemas.base import decode
from libs.schemas.common import InputItem
from libs.schemas.engine import OpenSession, OutputChunk, SessionDescriptor, SessionInfo
from services.engine_host.output import assemble
from services.engine_host.runtime import EngineRuntime
from services.engine_host.session import MAX_PENDING_INPUTS


class Outputs:
    """Collects what a runtime publishes, per session, as (block, frames, audio)."""

    def __init__(self) -> None:
        self.chunks: list[OutputChunk] = []

    async def __call__(self, subject: str, payload: bytes) -> None:
        chunk = decode(payload, OutputChunk)
        assert subject == f"sf.output.{chunk.session_id}" and len(payload) < 1 << 20
        self.chunks.append(chunk)

    def frames(self, sid: str) -> list[torch.Tensor]:
        blocks = sorted({c.block for c in self.chunks if c.session_id == sid})
        return [assemble([c for c in self.chunks if c.session_id == sid and c.block == b and c.kind == "frames"])
                for b in blocks]


@pytest.fixture
async def runtime():
    out = Outputs()
    rt = EngineRuntime("cpu", host_id="h1", publish=out)
    rt.outputs = out
    await rt.start()
    yield rt
    await rt.stop()


def action(sid: str, seq: int, keys=("w",)) -> InputItem:
    return InputItem(session_id=sid, seq=seq, kind="action", data=json.dumps({"keys": list(keys)}).encode())


def text(sid: str, seq: int, words: str) -> InputItem:
    return InputItem(session_id=sid, seq=seq, kind="text", data=json.dumps(words).encode())


async def test_inputs_apply_in_order_and_bad_ones_change_nothing(runtime):
    await runtime.open(OpenSession(session_id="w1", backend="world", seed=1))
    assert await runtime.apply_input(action("w1", 1)) == 1
    before = runtime.info("w1")
    state = clone_tree(runtime.state_tree("w1"))
    for bad, err in [(action("w1", 1), Conflict), (action("w1", 3), Conflict), (action("nope", 1), NotFound)]:
        with pytest.raises(err):
            await runtime.apply_input(bad)
    assert runtime.info("w1") == before and trees_equal(state, runtime.state_tree("w1"))
    # items the backend refuses are skipped: each takes its seq, changes no state, and is counted
    assert await runtime.apply_input(text("w1", 2, "hi")) == 2
    assert await runtime.apply_input(InputItem(session_id="w1", seq=3, kind="action", data=b'{"keys": ["?"]}')) == 3
    info = runtime.info("w1")
    assert (info.input_cursor, info.rejected_inputs, info.last_rejected_seq) == (3, 2, 3)
    assert "keys" in info.last_rejected_detail and trees_equal(state, runtime.state_tree("w1"))
    await runtime.apply_input(action("w1", 4))
    await runtime.advance("w1", 2)
    info = runtime.info("w1")
    assert info.consumed_seq == 4 and info.blocks_done == 2
    m = runtime.metrics("w1")
    assert m.blocks == 2 and m.control_to_output_p50_ms > 0 and {s.stage for s in m.stages} == {
        "encode", "denoise", "decode"}


async def test_open_rejects_bad_requests(runtime):
    good = dict(session_id="s", backend="world", seed=1)
    for bad in [dict(good, session_id="a.b"), dict(good, backend="llm"), dict(good, tier=3),
                dict(good, session_class="C1"), dict(good, period_ms=40.0),
                dict(good, tier=1, quality_floor=2)]:
        with pytest.raises(BadRequest):
            await runtime.open(OpenSession(**bad))
    await runtime.open(OpenSession(**good))
    with pytest.raises(Conflict):
        await runtime.open(OpenSession(**good))
    with pytest.raises(BadRequest):
        await runtime.advance("s", 0)
    await runtime.open(OpenSession(session_id="p", backend="avatar", seed=1, session_class="C1", period_ms=400))
    with pytest.raises(Conflict):
        await runtime.advance("p", 1)
    for verb in (runtime.suspend, runtime.resume, runtime.close):
        with pytest.raises(NotFound):
            await verb("ghost")
    with pytest.raises(Conflict):
        await runtime.resume("s")  # not suspended


async def test_same_seed_and_inputs_give_identical_outputs_across_runtimes(runtime):
    other_out = Outputs()
    other = EngineRuntime("cpu", publish=other_out)
    await other.start()
    try:
        for rt in (runtime, other):
            await rt.open(OpenSession(session_id="av", backend="avatar", seed=4, prompt="calm"))
            await rt.apply_input(text("av", 1, "good morning"))
            await rt.advance("av", 2)
            await rt.apply_input(text("av", 2, "and goodbye"))
            await rt.advance("av", 1)
        a, b = runtime.outputs.frames("av"), other_out.frames("av")
        assert len(a) == 3 and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
        assert trees_equal(runtime.state_tree("av"), other.state_tree("av"))
    finally:
        await other.stop()


async def test_suspend_resume_is_bit_exact(runtime):
    for sid in ("a", "b"):
        await runtime.open(OpenSession(session_id=sid, backend="world", seed=9))
        await runtime.advance(sid, 2)
    await runtime.suspend("a")
    assert runtime.info("a").state == "suspended"
    assert runtime.state_bytes_resident() == runtime.info("b").state_bytes
    await runtime.apply_input(action("a", 1))  # input is accepted while suspended
    with pytest.raises(Conflict):
        await runtime.advance("a", 1)
    with pytest.raises(Conflict):
        await runtime.suspend("a")
    await runtime.resume("a")
    await runtime.apply_input(action("b", 1))
    await asyncio.gather(runtime.advance("a", 3), runtime.advance("b", 3))
    assert trees_equal(runtime.state_tree("a"), runtime.state_tree("b"))
    assert all(torch.equal(x, y) for x, y in zip(runtime.outputs.frames("a"), runtime.outputs.frames("b"), strict=True))
    assert any(i.reason == "suspended" for i in runtime.metrics("a").idle)


async def test_mover_endpoint_moves_state_bit_exactly(runtime):
    dest_out = Outputs()
    dest = EngineRuntime("cpu", host_id="h2", publish=dest_out)
    await dest.start()
    try:
        await runtime.open(OpenSession(session_id="m", backend="world", seed=3, prompt="cave"))
        await runtime.apply_input(action("m", 1))
        await runtime.advance("m", 2)
        await runtime.apply_input(action("m", 2, keys=("a",)))  # pending: travels in the descriptor
        async with runtime.block_boundary("m"):
            tree = clone_tree(runtime.state_tree("m"))
            desc = runtime.session_descriptor("m")
        perturbed = clone_tree(tree)
        perturbed["kv"].view(-1)[12345] += 1e-3
        await dest.install_state("m", tree, desc)
        assert dest.info("m").input_cursor == 2 and dest.info("m").consumed_seq == 1
        other = EngineRuntime("cpu", host_id="h3", publish=Outputs())
        await other.start()
        await other.install_state("m", perturbed, desc)
        for rt in (runtime, dest, other):
            await rt.apply_input(action("m", 3, keys=("d", "space")))
            await rt.advance("m", 3)
        src_frames, dst_frames = runtime.outputs.frames("m")[2:], dest_out.frames("m")
        assert len(dst_frames) == 3 and all(torch.equal(x, y) for x, y in zip(src_frames, dst_frames, strict=True))
        assert trees_equal(runtime.state_tree("m"), dest.state_tree("m"))
        assert not trees_equal(runtime.state_tree("m"), other.state_tree("m"))
        await other.stop()
        await runtime.drop_session("m")
        with pytest.raises(NotFound):
            runtime.state_tree("m")
        with pytest.raises(NotFound):
            runtime.block_boundary("m")
    finally:
        await dest.stop()


async def test_a_fenced_host_runs_no_block_of_a_moved_in_session_before_its_claim(runtime):
    """Invariant: on a fenced host every block is journaled before its output goes out, and only a
    claimed owner has a journal, so a session a move installs runs nothing until its claim takes over
    the install's hold (`Assignments` gates, claims, takes the journal, then ungates)."""
    await runtime.open(OpenSession(session_id="g", backend="world", seed=1, session_class="C1", period_ms=20))
    async with runtime.block_boundary("g"):
        tree, desc = clone_tree(runtime.state_tree("g")), runtime.session_descriptor("g")
    for fenced in (True, False):
        out = Outputs()
        dest = EngineRuntime("cpu", host_id="h2", publish=out, gate_moved_in=fenced)
        await dest.start()
        try:
            await dest.install_state("g", tree, desc)
            start = dest.info("g").blocks_done
            await asyncio.sleep(0.3)  # 15 periods
            if not fenced:  # what a host without fencing does, and what a fenced one did before
                assert dest.info("g").blocks_done > start
                continue
            assert dest.info("g").blocks_done == start and not out.chunks
            dest.gate("g")  # the assignment takes the install's hold over: one ungate releases it
            dest.ungate("g")
            await asyncio.sleep(0.3)
            assert dest.info("g").blocks_done > start and out.chunks
        finally:
            await dest.stop()


async def test_install_state_rejects_mismatched_trees_and_descriptors(runtime):
    await runtime.open(OpenSession(session_id="x", backend="avatar", seed=1))
    tree, desc = clone_tree(runtime.state_tree("x")), runtime.session_descriptor("x")
    dest = EngineRuntime("cpu")
    bad_shape = dict(tree, prosody=torch.zeros(3, 3))
    bad_scalar = dict(tree, block="0")
    missing = {k: v for k, v in tree.items() if k != "phase"}
    for t, d, err in [(bad_shape, desc, BadRequest), (bad_scalar, desc, BadRequest), (missing, desc, BadRequest),
                      (tree, b"junk", SchemaError), (tree, desc, BadRequest)]:
        with pytest.raises(err):
            await dest.install_state("y" if d == desc and t is tree else "x", t, d)
    assert dest.status().sessions == []
    # installing over a live session swaps its state at a block boundary
    await runtime.advance("x", 1)
    await runtime.install_state("x", tree, desc)
    assert trees_equal(runtime.state_tree("x"), tree) and runtime.info("x").blocks_done == 0
    assert isinstance(decode(desc, SessionDescriptor), SessionDescriptor)


async def test_block_boundary_holds_off_blocks(runtime):
    await runtime.open(OpenSession(session_id="c", backend="world", seed=1, session_class="C1", period_ms=20))
    await asyncio.sleep(0.1)
    async with runtime.block_boundary("c"):
        n = runtime.info("c").blocks_done
        snapshot = clone_tree(runtime.state_tree("c"))
        await asyncio.sleep(0.1)
        assert runtime.info("c").blocks_done == n and trees_equal(snapshot, runtime.state_tree("c"))
    await asyncio.sleep(0.1)
    assert runtime.info("c").blocks_done > n
    assert any(i.reason == "block_boundary" for i in runtime.metrics("c").idle)
    m = runtime.metrics("c")
    assert m.first_output_ms > 0 and m.chunk_period_p50_ms > 0 and m.rtf_p95 > 0


async def test_backend_that_raises_mid_block_fails_only_its_session(runtime, monkeypatch):
    await runtime.open(OpenSession(session_id="ok", backend="world", seed=1))
    await runtime.open(OpenSession(session_id="bad", backend="avatar", seed=1))
    backend = runtime.backend("avatar")  # the one instance the host's avatar sessions share
    real = backend.denoise_batch

    def boom(states, carries, steps):
        raise RuntimeError("CUDA error: an illegal memory access")

    monkeypatch.setattr(backend, "denoise_batch", boom)
    with pytest.raises(Conflict):
        await runtime.advance("bad", 1)
    monkeypatch.setattr(backend, "denoise_batch", real)
    for _ in range(50):
        if not runtime.holds("bad"):
            break
        await asyncio.sleep(0.01)
    with pytest.raises(NotFound, match="failed"):
        runtime.info("bad")
    assert all("bad" not in a.slots for a in runtime.pipeline.actors)
    assert runtime.pipeline.counters.slot_leaks == 0
    await runtime.advance("ok", 2)
    assert runtime.info("ok").blocks_done == 2
    await runtime.open(OpenSession(session_id="bad", backend="avatar", seed=1))  # the id can be reused
    await runtime.advance("bad", 1)


async def test_coalesced_batching_runs_same_shape_sessions_together():
    rt = EngineRuntime("cpu", publish=Outputs(), max_batch=4, max_in_flight=1)
    rt.sched.record = True
    await rt.start()
    try:
        for i in range(4):
            await rt.open(OpenSession(session_id=f"b{i}", backend="world", seed=i, determinism="T2"))
        await asyncio.gather(*(rt.advance(f"b{i}", 4) for i in range(4)))
        assert max(len(d.sids) for d in rt.sched.dispatched) > 1  # a batched quantum ran
        assert sum(len(d.sids) for d in rt.sched.dispatched) == 16  # and each block ran once
        assert all(rt.info(f"b{i}").blocks_done == 4 for i in range(4))
    finally:
        await rt.stop()


async def test_session_and_input_limits():
    rt = EngineRuntime("cpu", max_sessions=1)
    await rt.start()
    try:
        await rt.open(OpenSession(session_id="a", backend="world", seed=1))
        with pytest.raises(Busy):
            await rt.open(OpenSession(session_id="b", backend="world", seed=1))
        for seq in range(1, MAX_PENDING_INPUTS + 1):
            await rt.apply_input(action("a", seq))
        with pytest.raises(Busy):
            await rt.apply_input(action("a", MAX_PENDING_INPUTS + 1))
        assert rt.info("a").input_cursor == MAX_PENDING_INPUTS
    finally:
        await rt.stop()


@pytest.mark.parametrize("seed", range(4))
async def test_random_verb_interleavings_keep_the_runtime_consistent(seed):
    """Random concurrent inputs, advances, suspends/resumes, boundary holds and close/reopen on three
    sessions: each awaited verb has exactly the outcome a model of the sessions' states predicts,
    every accepted input is folded into exactly one block, and nothing is left in flight or holding
    a slot."""
    import random

    rng = random.Random(seed)
    rt = EngineRuntime("cpu", publish=Outputs(), max_batch=rng.choice([1, 4]))
    await rt.start()
    cursors = {}
    status: dict[str, str] = {}  # the model: "running" or "suspended"; absent when not open
    runs: dict[str, int] = {}  # how often each id was opened: an advance belongs to one run
    closed: set[tuple[str, int]] = set()
    advances: list[tuple[tuple[str, int], asyncio.Task]] = []
    holds: list[asyncio.Task] = []

    async def hold(sid: str) -> None:
        async with rt.block_boundary(sid):
            await asyncio.sleep(rng.random() * 0.01)

    async def closes_its_advances(run: tuple[str, int]) -> None:
        """A close leaves none of its session's advances waiting: each has its blocks or is told."""
        tasks = [task for r, task in advances if r == run]
        if tasks:
            await asyncio.wait(tasks, timeout=5)
        for task in tasks:
            assert task.done()
            e = task.exception()
            assert e is None or isinstance(e, Conflict) and "was closed" in e.detail, e
        closed.add(run)

    def expected(op: str, sid: str) -> type[Exception] | None:
        state = status.get(sid)
        if op == "open":
            return Conflict if state else None
        if state is None:
            return NotFound
        if op == "suspend":
            return None if state == "running" else Conflict
        if op == "resume":
            return None if state == "suspended" else Conflict
        return None  # input and close work on an open session, suspended or not

    try:
        for step in range(60):
            sid = f"r{rng.randrange(3)}"
            op = rng.choice(["open", "input", "input", "advance", "advance", "suspend", "resume", "hold", "close"])
            if op == "advance":
                if status.get(sid) == "running":
                    advances.append(((sid, runs[sid]), asyncio.create_task(rt.advance(sid, rng.randint(1, 3)))))
                    await asyncio.sleep(0)  # it is accepted (and waits for its blocks) before the next verb
                continue
            if op == "hold":
                if sid in status:
                    holds.append(asyncio.create_task(hold(sid)))
                continue
            want = expected(op, sid)
            try:
                if op == "open":
                    await rt.open(OpenSession(session_id=sid, backend="world", seed=step, determinism="T2"))
                    cursors[sid], status[sid] = 0, "running"
                    runs[sid] = runs.get(sid, 0) + 1
                elif op == "input":
                    cursors[sid] = await rt.apply_input(action(sid, cursors.get(sid, 0) + 1))
                elif op == "suspend":
                    await rt.suspend(sid)
                    status[sid] = "suspended"
                elif op == "resume":
                    await rt.resume(sid)
                    status[sid] = "running"
                else:
                    await rt.close(sid, finish=rng.random() < 0.5)
                    del status[sid]
                    await closes_its_advances((sid, runs[sid]))
                got = None
            except (NotFound, Conflict) as e:
                got = type(e)
            assert got is want, f"step {step}: {op} {sid} in {status.get(sid)} gave {got}, not {want}"
            await asyncio.sleep(rng.random() * 0.003)
        for sid in [s for s, st in status.items() if st == "suspended"]:
            await rt.resume(sid)
        await asyncio.gather(*holds)  # a hold always ends (a closed session's too)
        for run, task in advances:
            if run not in closed:  # its session stayed open: it finishes its blocks
                assert isinstance(await task, SessionInfo)
        for sid in status:
            await rt.advance(sid, 1)  # folds whatever is still pending
            info = rt.info(sid)
            assert info.consumed_seq == info.input_cursor == cursors[sid]
        assert rt.dispatcher.in_flight == 0
        assert all(v == 0 for v in rt.pipeline.in_flight.values())
    finally:
        await rt.stop()
    c = rt.pipeline.counters
    assert c.slot_leaks == 0 and c.duplicate == 0 and c.cleanup_failures == 0
    assert all(not a.slots for a in rt.pipeline.actors)


async def test_the_heartbeat_load_is_what_admission_budgets_and_the_profile_follows_serving_costs():
    """Admission budgets a C1 session at its floor row (`contracts.demand`); the host's busy_fraction counts
    each session the same way, at the costs serving has learned, which the heartbeat's rows carry too.
    What the session is served at (its best tier here, while there is room) is reported beside it."""
    from libs.contracts import Contract, demand, floor_row
    from libs.schemas.common import ProfileRow

    rt = EngineRuntime("cpu", host_id="h1", publish=Outputs())
    rows = [ProfileRow(backend="world", tier=t, quantum_ms=q, block_ms=2 * q, state_bytes=1, media_s_per_block=0.1)
            for t, q in ((1, 5.0), (2, 10.0), (4, 20.0))]
    rt.seed_costs(rows)
    await rt.start()
    try:
        await rt.open(OpenSession(session_id="c", backend="world", seed=1, session_class="C1", period_ms=1000.0,
                                  quality_floor=2))
        shape = rt.sched.tasks["c"].shape
        # Every stage of a block is priced: the start-up profile's whole block (20 ms) seeds what serving
        # learns (the stage sum); serving measured 30 ms for the floor tier.
        rt.costs.learn(shape, 2, 1, 0.030)
        contract = Contract(session_class="C1", quality_floor=2, determinism="T1", period_ms=1000.0)
        row = floor_row(rt.refreshed_profile(rows), "world", 2)
        assert row is not None and row.block_ms == pytest.approx(30.0)  # what serving measured over the window
        assert row.quantum_ms / row.block_ms == pytest.approx(0.5)  # start-up's denoise share, kept
        assert rt.busy_fraction() == pytest.approx(demand(contract, row).busy_fraction)
        assert rt.served_fraction() == pytest.approx(rt.costs.estimate(shape, rt.sched.tasks["c"].tier, 1))
        async with rt.boundaries.hold(rt.sessions.get("c")):  # a checkpoint or a move holds it: it still counts
            assert rt.busy_fraction() == pytest.approx(demand(contract, row).busy_fraction)
        await rt.suspend("c")  # offloaded: it takes no device time until it resumes
        assert rt.busy_fraction() == 0.0
    finally:
        await rt.stop()


def curved_row():
    """A world row with a co-location curve (100 ms alone, 150 at two), far above what a world block takes
    even on a loaded machine."""
    from libs.schemas.common import ProfileRow

    return ProfileRow(backend="world", tier=1, quantum_ms=50.0, block_ms=100.0, state_bytes=1, media_s_per_block=0.1,
                      colocated=[100.0, 150.0])


async def two_c1_sessions(row) -> EngineRuntime:
    """A started runtime seeded with `row`, holding two C1 world sessions at a 1 s period, gated so that no
    block runs and teaches the cost model a price the test did not give it (stop it)."""
    rt = EngineRuntime("cpu", host_id="h1", publish=Outputs())
    rt.seed_costs([row])
    await rt.start()
    for i in range(2):
        await rt.open(OpenSession(session_id=f"c{i}", backend="world", seed=i, session_class="C1",
                                  period_ms=1000.0, quality_floor=1), gated=True)
    return rt


async def test_the_heartbeat_load_of_k_sessions_is_what_their_marginal_prices_sum_to():
    """With a co-location curve, k sessions are reported at k × block(k), the device time admission's
    marginal prices (`contracts.demand` at 0, 1, … sessions) added up to."""
    from libs.contracts import Contract, demand

    row = curved_row()
    rt = await two_c1_sessions(row)
    try:
        contract = Contract(session_class="C1", quality_floor=1, determinism="T1", period_ms=1000.0)
        admitted = demand(contract, row, 0).busy_fraction + demand(contract, row, 1).busy_fraction
        assert rt.busy_fraction() == pytest.approx(admitted) == pytest.approx(2 * 150.0 / 1000.0)
    finally:
        await rt.stop()


async def test_a_price_learned_beside_k_sessions_is_not_slowed_down_again_by_the_curve():
    """Serving learns a block's cost at the concurrency it runs at, co-location included: the load reported
    for k sessions is that price, never the learned price scaled by the curve a second time; the heartbeat's
    rows scale the curve by learned over the curve at k."""
    from libs.contracts import floor_row

    row = curved_row()
    rt = await two_c1_sessions(row)
    try:
        shape = rt.sched.tasks["c0"].shape
        for _ in range(40):  # two sessions' blocks took 150 ms each: what the curve said of k = 2
            rt.costs.learn(shape, 1, 1, 0.150)
        assert rt.busy_fraction() == pytest.approx(2 * 0.150, rel=1e-3)  # not 2 × 150 × 1.5
        held = floor_row(rt.refreshed_profile([row]), "world", 1)  # the curve held: the row stays as measured
        assert held is not None and held.colocated == pytest.approx(row.colocated, rel=1e-3)
        await asyncio.sleep(MEASURE_WINDOW_S + 0.1)  # the 150 ms blocks leave the measurement window
        for _ in range(40):  # the device got slower than its curve: 300 ms at k = 2, twice the curve
            rt.costs.learn(shape, 1, 1, 0.300)
        assert rt.busy_fraction() == pytest.approx(2 * 0.300, rel=1e-3)
        fresh = floor_row(rt.refreshed_profile([row]), "world", 1)
        assert fresh is not None and fresh.colocated == pytest.approx([200.0, 300.0], rel=1e-3)
        assert fresh.block_ms == pytest.approx(200.0, rel=1e-3) and fresh.quantum_ms == pytest.approx(100.0, rel=1e-3)
    finally:
        await rt.stop()


async def test_a_session_suspended_with_its_share_held_is_priced_as_held_until_it_resumes():
    """A C1 shed as `capacity_lost` is re-queued for the room it leaves: its host prices that room apart
    (`held_fraction`, which admission counts), so no newcomer takes it; an idle offload frees its share."""
    row = curved_row()
    rt = await two_c1_sessions(row)
    try:
        both = rt.busy_fraction()
        await rt.suspend("c0", hold_share=True)  # priced apart: what runs, and what it holds for c0
        # c1 alone is 100 ms a 1 s period; c0's hold is its block beside both (150 ms)
        assert (rt.busy_fraction(), rt.held_fraction()) == (pytest.approx(0.100), pytest.approx(0.150))
        await rt.resume("c0")
        assert (rt.busy_fraction(), rt.held_fraction()) == (pytest.approx(both), 0.0)
        await rt.suspend("c0")  # an idle offload holds nothing
        assert rt.busy_fraction() < both and rt.held_fraction() == 0.0
    finally:
        await rt.stop()


async def test_the_heartbeat_says_how_many_of_its_sessions_its_prices_were_measured_beside():
    """Admission's ramp reads `measured_sessions`: a session that arrived after the last learned quantum is
    not measured yet; one that takes no device share (suspended here) counts as measured."""
    row = curved_row()
    rt = await two_c1_sessions(row)
    try:
        shape = rt.sched.tasks["c0"].shape
        assert rt.measured_sessions() == 0  # nothing learned: neither session was measured
        rt.costs.learn(shape, 1, 1, 0.150)
        assert rt.measured_sessions() == 2
        await rt.open(OpenSession(session_id="c2", backend="world", seed=2, session_class="C1",
                                  period_ms=1000.0, quality_floor=1), gated=True)
        assert rt.measured_sessions() == 2  # the newcomer ran beside nothing learned yet
        rt.costs.learn(shape, 1, 1, 0.150)
        assert rt.measured_sessions() == 3
        await rt.suspend("c2")  # offloaded: priced at nothing
        assert rt.measured_sessions() == 3
    finally:
        await rt.stop()


def test_a_price_below_its_start_up_profile_is_believed_and_a_burst_is_priced_by_the_curves_slope():
    """Start-up is not a floor: a profile taken while a neighbour loaded the machine priced every block at
    four times what serving measured, and failover's survivors read full while the device ran a sixth of
    its time (`bench.failover --hog 2`, 2026-12-04). What serving learned beside k sessions sets the level;
    the start-up curve carries it to another k, so cheap lone blocks do not price a burst as cheap."""
    from services.engine_host.costs import CostModel

    served = {"k": 1}
    curve = {1: 15.0, 2: 20.0, 4: 30.0, 8: 60.0}.__getitem__  # start-up's block (ms) beside k sessions
    costs = CostModel(concurrency=lambda: served["k"])
    costs.seed("w", 1, 0.015, curve=curve)
    assert costs.price("w", 1, 1) == 0.015 and costs.price("w", 1, 8) == pytest.approx(0.060)  # start-up only
    for _ in range(40):  # a lone session's blocks run at 4 ms: a third of what start-up measured
        costs.learn("w", 1, 1, 0.004)
    assert costs.price("w", 1, 1) == pytest.approx(0.004, rel=1e-3)
    assert costs.price("w", 1, 8) == pytest.approx(0.004 * 60 / 15, rel=1e-3)  # the burst, by the slope
    served["k"] = 4
    for _ in range(40):  # beside four, 12 ms: co-location is in what was learned, not counted again
        costs.learn("w", 1, 1, 0.012)
    assert costs.price("w", 1, 4) == pytest.approx(0.012, rel=1e-3)
    assert costs.price("w", 1, 1) == pytest.approx(0.012 * 15 / 30, rel=1e-3)
    assert costs.estimate("w", 1, 1) == pytest.approx(0.012, rel=1e-3)  # the scheduler plans with what ran
