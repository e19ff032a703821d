"""What the block journal costs per block: recording each block's consumed items before its output goes out.

    python -m bench.journal [--quick] --json PATH

On a real nats-server (file storage), S sessions each finish a block every `period` (as C1
sessions do) for D seconds; every block goes through the session's `OutputJournal` exactly as
the engine's sink hands it over, and "publishing" records when the block's output would leave.
Measured: the delay the journal adds between a block finishing and its output leaving (p50/p99),
journal entries per block (group commit folds blocks that finish while an append is in flight),
stored bytes per block, and appends per second on the bus. A second run with no period (blocks
as fast as the journal takes them) shows the group commit under load.
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
from services.engine_host.journal import Finished, OutputJournal

TARGET_DELAY_P99_MS = 5.0  # well under one 40 ms block


async def run_sessions(url: str, sessions: int, period_s: float, seconds: float, tag: str) -> dict:
    nc = await bus.connect(url, name="bench-journal")
    js = nc.jetstream()
    delays: list[float] = []
    finished_at: dict[tuple[str, int], float] = {}

    async def one(i: int) -> tuple[int, int]:
        sid = f"{tag}{i}"
        writer, _ = await BlockJournal.take(js, sid, Owner(server_id="bench", version=1))

        async def publish(block: int, output: Output, replayed: bool) -> None:
            delays.append(time.perf_counter() - finished_at.pop((sid, block)))

        journal = OutputJournal(writer, publish)
        end = time.perf_counter() + seconds
        block = seq = 0
        out = Output(frames=torch.zeros(0, dtype=torch.uint8))
        while time.perf_counter() < end:
            block += 1
            seq += 1
            finished_at[(sid, block)] = time.perf_counter()
            journal.add(Finished(ConsumedBlock(block=block, first_seq=seq, last_seq=seq, tier=4), out, False))
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
    return {"sessions": sessions, "period_ms": period_s * 1000, "blocks": blocks, "entries": entries,
            "entries_per_block": entries / blocks, "stored_bytes_per_block": info.state.bytes / blocks,
            "appends_per_s": entries / wall, "blocks_per_s": blocks / wall,
            "delay_ms_p50": statistics.median(delays) * 1000,
            "delay_ms_p99": delays[int(len(delays) * 0.99)] * 1000}


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
        finally:
            server.stop()
    return {"periodic": periodic, "flat_out": flat_out, "targets": {"periodic.delay_ms_p99": TARGET_DELAY_P99_MS}}


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
    write(args.json, result)


if __name__ == "__main__":
    main()
