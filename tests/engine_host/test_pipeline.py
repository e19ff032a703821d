"""The stage pipeline: per-session order with fair interleaving, bounded memory under a slow consumer,
ordered shutdown with zero leaked slots after cancellation, actor failure and cleanup failure."""

from __future__ import annotations

import asyncio
import random
import sys
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from libs.errors import Conflict, Internal, NotFound
from services.engine_host.pipeline import StagePipeline
from services.engine_host.work import Item, Stage, Work


def work(sid: str, seq: int, value=None) -> Work:
    return Work(items=[Item(sid=sid, seq=seq, epoch=0, data=value if value is not None else [])], meta=None)


def tagging(name: str, delay_s: float = 0.0):
    def run(w: Work) -> None:
        if delay_s:
            time.sleep(delay_s)
        for it in w.items:
            it.data.append(name)
    return Stage(name, run)


async def test_interleaved_sessions_keep_their_order_and_are_served_fairly():
    seen: list[tuple[str, int, list]] = []

    async def sink(w: Work) -> None:
        seen.extend((it.sid, it.seq, it.data) for it in w.items)

    pipe = StagePipeline([tagging("a"), tagging("b", 0.0005), tagging("c")], sink, edge_capacity=3)
    pipe.start()
    sids = [f"s{i}" for i in range(4)]
    for sid in sids:
        await pipe.open(sid)
    rng = random.Random(7)

    async def producer(sid: str, n: int) -> None:
        for seq in range(n):
            await pipe.submit(work(sid, seq))
            if rng.random() < 0.3:
                await asyncio.sleep(0)

    # s0 submits a burst of 40 while the others submit 10 each
    await asyncio.gather(producer("s0", 40), *(producer(s, 10) for s in sids[1:]))
    for sid in sids:
        await pipe.close(sid)
    await pipe.shutdown()
    for sid in sids:
        seqs = [seq for s, seq, _ in seen if s == sid]
        assert seqs == list(range(len(seqs)))  # strict per-session order, nothing lost
    assert all(data == ["a", "b", "c"] for _, _, data in seen)
    # fairness: the last of the small sessions finishes before the burst is half done
    last_small = max(i for i, (s, _, _) in enumerate(seen) if s != "s0")
    burst_done_by_then = sum(1 for s, _, _ in seen[:last_small] if s == "s0")
    assert burst_done_by_then <= 30
    assert pipe.counters.duplicate == pipe.counters.stale == pipe.counters.slot_leaks == 0


async def test_each_stage_has_one_owner_at_a_time_and_a_lone_block_stays_on_one_thread():
    guard = threading.Lock()
    active = {"a": 0, "b": 0, "c": 0}
    overlaps: list[str] = []  # a stage found running on two threads at once
    busiest = 0  # most stages running at the same moment
    threads: dict[tuple[str, int], set[int]] = {}

    def stage(name: str) -> Stage:
        def run(w: Work) -> None:
            nonlocal busiest
            with guard:
                active[name] += 1
                if active[name] > 1:
                    overlaps.append(name)
                busiest = max(busiest, sum(active.values()))
            time.sleep(0.001)
            for it in w.items:
                threads.setdefault((it.sid, it.seq), set()).add(threading.get_ident())
            with guard:
                active[name] -= 1
        return Stage(name, run)

    done = asyncio.Event()

    async def sink(w: Work) -> None:
        done.set()

    pipe = StagePipeline([stage("a"), stage("b"), stage("c")], sink, edge_capacity=2)
    pipe.start()
    await pipe.open("lone")
    for seq in range(5):  # one block at a time, nothing else waiting: carried through on one thread
        done.clear()
        await pipe.submit(work("lone", seq))
        await done.wait()
    assert all(len(threads[("lone", seq)]) == 1 for seq in range(5))
    sids = [f"s{i}" for i in range(4)]
    for sid in sids:
        await pipe.open(sid)

    async def burst(sid: str) -> None:
        for seq in range(10):
            await pipe.submit(work(sid, seq))

    await asyncio.gather(*(burst(sid) for sid in sids))
    for sid in ["lone", *sids]:
        await pipe.close(sid)
    await pipe.shutdown()
    assert overlaps == []
    assert busiest >= 2  # under load the stages still run side by side on their own threads
    assert pipe.counters.stale == pipe.counters.duplicate == pipe.counters.slot_leaks == 0


async def test_backpressure_bounds_memory_under_a_slow_consumer():
    cap = 2
    high = 0
    sink_gate = asyncio.Event()
    submitted = 0

    async def sink(w: Work) -> None:
        await sink_gate.wait()
        await asyncio.sleep(0.001)

    pipe = StagePipeline([tagging("a"), tagging("b")], sink, edge_capacity=cap)
    pipe.start()
    await pipe.open("s")

    async def producer() -> None:
        nonlocal submitted
        for seq in range(200):
            await pipe.submit(work("s", seq))
            submitted += 1

    task = asyncio.create_task(producer())
    for _ in range(50):
        await asyncio.sleep(0.002)
        high = max(high, pipe.in_flight["s"])
    # edges: source + 2 stage outputs, each `cap`, one work in each actor, one in the sink, and the
    # one `submit` is waiting to put
    bound = 3 * cap + 3 + 1
    assert submitted <= bound and high <= bound and not task.done()
    sink_gate.set()
    await task
    await pipe.close("s")
    await pipe.shutdown()
    assert pipe.in_flight == {}


async def test_cancel_drops_queued_work_and_releases_every_slot():
    released: list[tuple[str, str]] = []
    out = []

    def stage(name):
        def run(w):
            time.sleep(0.002)
        return Stage(name, run, release=lambda sid, scratch: released.append((name, sid)))

    async def sink(w):
        out.extend(it.seq for it in w.items)

    pipe = StagePipeline([stage("enc"), stage("den"), stage("dec")], sink, edge_capacity=4)
    pipe.start()
    await pipe.open("s")
    await pipe.open("t")
    for seq in range(4):
        await pipe.submit(work("s", seq))
    await pipe.close("s", finish=False)
    assert [n for n, sid in released if sid == "s"] == ["dec", "den", "enc"]  # reverse topological order
    assert all("s" not in a.slots for a in pipe.actors)
    with pytest.raises(NotFound):
        await pipe.submit(work("s", 9))
    await pipe.submit(work("t", 0))  # the other session is untouched
    await pipe.close("t")
    await pipe.shutdown()
    assert pipe.counters.slot_leaks == 0 and 0 in out and len(out) < 5
    assert pipe.counters.stale + len(out) == 5


async def test_actor_failure_fails_only_that_work_and_cleans_up():
    results = []

    def flaky(w):
        if any(it.sid == "bad" for it in w.items):
            raise RuntimeError("boom")

    async def sink(w):
        results.extend((it.sid, it.error) for it in w.items)

    pipe = StagePipeline([tagging("a"), Stage("flaky", flaky), tagging("c")], sink)
    pipe.start()
    await pipe.open("bad")
    await pipe.open("good")
    await pipe.submit(work("bad", 0))
    await pipe.submit(work("good", 0))
    await pipe.close("bad")
    await pipe.submit(work("good", 1))
    await pipe.close("good")
    await pipe.shutdown()
    errors = {sid: repr(e) for sid, e in results}
    assert "boom" in errors["bad"] and errors["good"] == "None"
    assert [sid for sid, _ in results].count("good") == 2
    assert pipe.counters.slot_leaks == 0


async def test_cleanup_failure_is_counted_and_the_slot_never_reused():
    def bad_release(sid, scratch):
        raise OSError("device gone")

    async def sink(w):
        pass

    pipe = StagePipeline([Stage("a", lambda w: None), Stage("b", lambda w: None, release=bad_release)], sink)
    pipe.start()
    await pipe.open("s")
    await pipe.submit(work("s", 0))
    with pytest.raises(Internal):
        await pipe.close("s")
    assert pipe.counters.cleanup_failures == 1
    b = pipe.actors[1]
    assert "s" not in b.slots and len(b.quarantined) == 1
    await pipe.open("s")  # a fresh slot, not the quarantined one
    assert b.slots["s"] is not b.quarantined[0]
    with pytest.raises(Internal):
        await pipe.shutdown()
    assert pipe.counters.cleanup_failures == 2 and pipe.counters.slot_leaks == 0


async def test_duplicates_gaps_and_orphans_are_counted_and_dropped():
    out = []

    async def sink(w):
        out.extend((it.sid, it.seq) for it in w.items)

    pipe = StagePipeline([tagging("a")], sink)
    pipe.start()
    await pipe.open("s")
    for seq in (0, 0, 1, 3, 2):
        await pipe.submit(work("s", seq))
    await pipe.close("s")
    with pytest.raises(Conflict):
        await pipe.open("x") or await pipe.open("x")
    await pipe.shutdown()
    assert out == [("s", 0), ("s", 1), ("s", 2)]
    assert pipe.counters.duplicate == 1 and pipe.counters.stale == 1  # the gap (3)


OPS = st.lists(st.tuples(st.sampled_from(["submit", "submit", "submit", "close", "cancel", "open"]),
                         st.integers(0, 2)), min_size=1, max_size=40)


@settings(max_examples=30, deadline=None)
@given(ops=OPS, fail_every=st.integers(0, 7), edge=st.integers(1, 3))
def test_random_submits_closes_and_failures_never_leak_or_reorder(ops, fail_every, edge):
    """Whatever the interleaving of submits, finishing closes, cancels, reopens and stage failures: each session
    run sees its blocks in order with no repeats, a finishing close loses nothing, and no slot or
    in-flight count is left behind."""
    asyncio.run(_random_run(ops, fail_every, edge))


async def _random_run(ops, fail_every, edge):
    seen: dict[tuple[str, int], list[int]] = {}
    calls = 0

    def maybe_fail(w: Work) -> None:
        nonlocal calls
        calls += 1
        if fail_every and calls % fail_every == 0:
            raise RuntimeError("injected")

    async def sink(w: Work) -> None:
        for it in w.items:
            seen.setdefault((it.sid, it.epoch), []).append(it.seq)
        await asyncio.sleep(0)

    pipe = StagePipeline([tagging("a"), Stage("flaky", maybe_fail), tagging("c")], sink, edge_capacity=edge)
    pipe.start()
    next_seq: dict[str, int] = {}
    submitted: dict[tuple[str, int], int] = {}
    drained: set[tuple[str, int]] = set()
    pending: dict[str, asyncio.Task] = {}  # submits are sequential per session, concurrent across them
    for op, n in ops:
        sid = f"s{n}"
        if op == "open" and sid not in pipe.epochs:
            await pipe.open(sid)
            next_seq[sid] = 0
        elif op == "submit" and sid in pipe.epochs and sid not in pipe.closing:
            key = (sid, pipe.epochs[sid])
            submitted[key] = submitted.get(key, 0) + 1
            if sid in pending:
                await pending.pop(sid)
            pending[sid] = asyncio.create_task(pipe.submit(work(sid, next_seq[sid])))
            next_seq[sid] += 1
            await asyncio.sleep(0)
        elif op in ("close", "cancel") and sid in pipe.epochs and sid not in pipe.closing:
            key = (sid, pipe.epochs[sid])
            await asyncio.gather(*pending.values())
            pending.clear()
            await pipe.close(sid, finish=op == "close")
            if op == "close":
                drained.add(key)
    await asyncio.gather(*pending.values())
    await pipe.shutdown(finish=True)
    for key, seqs in seen.items():
        assert seqs == sorted(set(seqs)), f"{key} out of order or repeated: {seqs}"
    for key in drained:  # a finishing close delivers every block submitted to that run (failed ones carry an error)
        assert len(seen.get(key, [])) == submitted.get(key, 0)
    assert pipe.in_flight == {} and pipe.counters.slot_leaks == 0 and pipe.counters.duplicate == 0
    assert all(not a.slots for a in pipe.actors)


async def test_a_second_concurrent_submit_for_a_session_is_refused():
    gate = asyncio.Event()

    async def sink(w):
        await gate.wait()

    pipe = StagePipeline([tagging("a")], sink, edge_capacity=1)
    pipe.start()
    await pipe.open("s")
    seq = 0
    while True:  # fill the pipeline until a submit has to wait
        task = asyncio.create_task(pipe.submit(work("s", seq)))
        await asyncio.sleep(0.01)
        seq += 1
        if not task.done():
            break
    with pytest.raises(Conflict):
        await pipe.submit(work("s", seq))
    gate.set()
    await task
    await pipe.close("s")
    await pipe.shutdown()
    assert pipe.counters.stale == pipe.counters.duplicate == 0


@pytest.fixture
def frequent_thread_switches():
    """Switch threads every microsecond instead of every 5 ms, so the short windows between a
    hand-off's steps (take, baton, put) are actually interleaved in a test run."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)


async def test_hand_offs_between_stage_threads_never_reorder_a_session(frequent_thread_switches):
    """Bursts of one session (so inboxes are often empty and works are carried from stage to stage)
    or two, on edges of 1-3: every work reaches the sink once, in order, through every stage."""
    rng = random.Random(11)
    for _ in range(60):
        sids = ["s0"] if rng.random() < 0.7 else ["s0", "s1"]
        seen = await _burst_run(rng, sids, blocks=30, edge=rng.randint(1, 3))
        assert all(seen[sid] == [(seq, ["a", "b", "c"]) for seq in range(30)] for sid in sids)


async def _burst_run(rng: random.Random, sids: list[str], *, blocks: int, edge: int) -> dict[str, list]:
    seen: dict[str, list[tuple[int, list]]] = {}

    def stage(name: str) -> Stage:
        def run(w: Work) -> None:
            if rng.random() < 0.5:
                time.sleep(rng.random() * 0.0003)
            for it in w.items:
                it.data.append(name)
        return Stage(name, run)

    async def sink(w: Work) -> None:
        for it in w.items:
            seen.setdefault(it.sid, []).append((it.seq, it.data))

    pipe = StagePipeline([stage("a"), stage("b"), stage("c")], sink, edge_capacity=edge)
    pipe.start()
    for sid in sids:
        await pipe.open(sid)

    async def burst(sid: str) -> None:
        for seq in range(blocks):
            await pipe.submit(work(sid, seq))
            if rng.random() < 0.3:
                await asyncio.sleep(rng.random() * 0.0005)

    await asyncio.gather(*(burst(sid) for sid in sids))
    for sid in sids:
        await pipe.close(sid)
    await pipe.shutdown()
    assert pipe.counters.stale == pipe.counters.duplicate == pipe.counters.orphaned == 0
    return seen
