"""What the block journal costs per block: recording each block's consumed items before its output goes out.

    python -m bench.journal [--quick] --json PATH

On a real nats-server (file storage), S sessions each finish a block every `period` (as C1
sessions do) for D seconds; every block goes through the session's `OutputJournal` exactly as
the engine's sink hands it over, and "publishing" records when the block's output would leave.
Measured: the delay the journal adds between a block finishing and its output leaving (p50/p99),
journal entries per block (group commit folds blocks that finish while an append is in flight),
stored bytes per block, and appends per second on the bus. A second run with no period (blocks
as fast as the journal takes them) shows the group commit under load.

`compare` runs the per-block design (an append for every block: `quiet_blocks=0`) and the quiet
window (an entry declares the next 25 blocks item-less unless recorded: `QUIET_BLOCKS`) in
interleaved rounds at 20 and 100 sessions, with an item every block (`dense`, the worst case: every
block must be recorded) and an item every 10th block (`sparse`, 2.5 items/s: a talking user), and
reports medians over the rounds and the new/old ratios.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import torch

from bench.common import parser, table, write
from libs import bus, names
from libs.fence import session_log
from libs.fence.block_journal import BlockJournal
from libs.natsd import NatsServer
from libs.schemas.fence import ConsumedBlock, Owner
from services.engine_host.backends import Output
from services.engine_host.journal import QUIET_BLOCKS, Finished, OutputJournal

TARGET_DELAY_P99_MS = 5.0  # well under one 40 ms block


async def run_sessions(url: str, sessions: int, period_s: float, seconds: float, tag: str, *,
                       quiet_blocks: int = QUIET_BLOCKS, item_every: int = 1) -> dict:
    nc = await bus.connect(url, name="bench-journal")
    js = nc.jetstream()
    delays: list[float] = []
    finished_at: dict[tuple[str, int], float] = {}

    async def one(i: int) -> tuple[int, int]:
        sid = f"{tag}{i}"
        writer, _ = await BlockJournal.take(js, sid, Owner(server_id="bench", version=1))

        async def publish(block: int, output: Output, replayed: bool, last_seq: int) -> None:
            delays.append(time.perf_counter() - finished_at.pop((sid, block)))

        journal = OutputJournal(writer, publish, quiet_blocks)
        end = time.perf_counter() + seconds
        block = seq = 0
        out = Output(frames=torch.zeros(0, dtype=torch.uint8))
        while time.perf_counter() < end:
            block += 1
            took = 1 if (block + i) % item_every == 0 else 0  # sessions' items do not arrive in lockstep
            finished_at[(sid, block)] = time.perf_counter()
            journal.add(Finished(ConsumedBlock(block=block, first_seq=seq + 1, last_seq=seq + took, tier=4),
                                 out, False))
            seq += took
            if period_s:
                await asyncio.sleep(period_s)
            elif journal.backlog >= 64:
                await journal.flushed()
        await journal.flushed()
        await journal.close()
        return block, writer.tail_seq

    t0 = time.perf_counter()
    done = await asyncio.gather(*(one(i) for i in range(sessions)))
    wall = time.perf_counter() - t0
    blocks = sum(b for b, _ in done)
    info = await js.stream_info(names.BLOCK_STREAM)  # purged between runs: this run's entries (and seals) only
    await nc.close()
    entries = info.state.messages
    delays.sort()
    return {"sessions": sessions, "period_ms": period_s * 1000, "quiet_blocks": quiet_blocks,
            "item_every": item_every, "blocks": blocks, "entries": entries,
            "entries_per_block": entries / blocks, "stored_bytes_per_block": info.state.bytes / blocks,
            "appends_per_s": entries / wall, "blocks_per_s": blocks / wall,
            "delay_ms_p50": statistics.median(delays) * 1000,
            "delay_ms_p99": delays[int(len(delays) * 0.99)] * 1000}


DESIGNS = {"per_block": 0, "quiet": QUIET_BLOCKS}
INPUTS = {"dense": 1, "sparse": 10}
KEYS = ("delay_ms_p50", "delay_ms_p99", "entries_per_block", "appends_per_s")


async def compare(url: str, rounds: int, seconds: float) -> list[dict]:
    """Old and new design, interleaved round by round at each size and input rate; medians per cell."""
    cells: dict[tuple[int, str, str], list[dict]] = {}
    for r in range(rounds):
        for sessions in (20, 100):
            for inputs, every in INPUTS.items():
                for design, quiet in (DESIGNS.items() if r % 2 == 0 else reversed(DESIGNS.items())):
                    got = await run_sessions(url, sessions, 0.04, seconds, f"c{r}{sessions}{inputs}{design}",
                                             quiet_blocks=quiet, item_every=every)
                    await purge(url)
                    cells.setdefault((sessions, inputs, design), []).append(got)
                    print(f"  round {r + 1}/{rounds} {sessions:>3} sessions {inputs:<6} {design:<9} "
                          f"p50 {got['delay_ms_p50']:.2f} ms  p99 {got['delay_ms_p99']:.2f} ms  "
                          f"{got['appends_per_s']:.0f} appends/s", flush=True)
    out = []
    for sessions in (20, 100):
        for inputs in INPUTS:
            row: dict = {"sessions": sessions, "inputs": inputs, "rounds": rounds}
            for design in DESIGNS:
                runs = cells[(sessions, inputs, design)]
                row[design] = {k: statistics.median(run[k] for run in runs) for k in KEYS}
            row["ratio_quiet_over_per_block"] = {
                k: row["quiet"][k] / row["per_block"][k] if row["per_block"][k] else None for k in KEYS}
            out.append(row)
    return out


async def main_async(quick: bool) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        server = NatsServer(store_dir=Path(tmp) / "nats").start()
        try:
            nc = await bus.connect(server.url, name="bench-setup")
            await session_log.provision(nc.jetstream())
            await nc.close()
            seconds = 3.0 if quick else 10.0
            periodic = await run_sessions(server.url, 20 if quick else 100, 0.04, seconds, "p")
            await purge(server.url)
            flat_out = await run_sessions(server.url, 4, 0.0, seconds / 2, "f")
            await purge(server.url)
            rows = await compare(server.url, 1 if quick else 3, 2.0 if quick else 5.0)
        finally:
            server.stop()
    return {"periodic": periodic, "flat_out": flat_out, "compare": rows,
            "targets": {"periodic.delay_ms_p99": TARGET_DELAY_P99_MS}}


async def purge(url: str) -> None:
    nc = await bus.connect(url, name="bench-purge")
    await nc.jetstream().purge_stream(names.BLOCK_STREAM)
    await nc.close()


def main() -> None:
    args = parser("journal", __doc__.splitlines()[0]).parse_args()
    result = asyncio.run(main_async(args.quick))
    p, f = result["periodic"], result["flat_out"]
    table([
        ("periodic.sessions", p["sessions"], "one 40 ms block each per period"),
        ("periodic.delay_ms_p50", p["delay_ms_p50"], "block finished -> output may leave"),
        ("periodic.delay_ms_p99", p["delay_ms_p99"], f"target <= {TARGET_DELAY_P99_MS}"),
        ("periodic.entries_per_block", p["entries_per_block"], "1 = no grouping needed"),
        ("periodic.stored_bytes_per_block", p["stored_bytes_per_block"], "JetStream file storage"),
        ("flat_out.blocks_per_s", f["blocks_per_s"], f"{f['sessions']} sessions, no period"),
        ("flat_out.entries_per_block", f["entries_per_block"], "group commit"),
    ])
    print("  compare (medians of interleaved rounds; quiet / per_block):")
    for row in result["compare"]:
        q, o, ratio = row["quiet"], row["per_block"], row["ratio_quiet_over_per_block"]
        print(f"  {row['sessions']:>3} sessions {row['inputs']:<6} p99 {o['delay_ms_p99']:.2f} -> "
              f"{q['delay_ms_p99']:.2f} ms, p50 {o['delay_ms_p50']:.2f} -> {q['delay_ms_p50']:.2f} ms, appends/s "
              f"{o['appends_per_s']:.0f} -> {q['appends_per_s']:.0f} (x{ratio['appends_per_s']:.2f})")
    write(args.json, result)


if __name__ == "__main__":
    main()
