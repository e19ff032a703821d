"""Co-location benchmark: block ms at 1, 2, 4, … concurrent scratch sessions, as engine hosts run them.

    flock /tmp/sf-bench.lock python -m bench.colocation [--quick] [--split] --json PATH

Two arms per backend and tier, interleaved round by round:

- `one_host`: one process at half the cores (one `statefleet up` host's torch threads), k sessions through the host's three stage threads
  (`services.engine_host.colocated.run_blocks`, what start-up measures);
- `two_hosts`: two processes, each at half the cores (what `statefleet up` starts on one machine:
  `torch_threads.default_count`), each running k sessions at the same time, so the device carries 2k.
  `two_hosts_device_block_ms` is the device's: both hosts' wall time over all their blocks;
  `two_hosts_per_host_block_ms` is one host's wall time over its own blocks (2× the device's);
- `one_host_all_cores`: one process at every core (a host alone on the machine).

`--split` instead runs world t1 at k = 2, 4, 8, 16 sessions in one process against the same k split
over two processes (and 16 as 10 / 6), through the probe processes start-up uses
(`services.engine_host.spread`), and reports per block both the device's wall time and its stage
time (every process's stage seconds over the blocks run: what the hosts' measured load sums).

The figure is the device time one block takes while k sessions keep the device busy; the capacity a
contract gets is the largest k with `k × blocks_per_window × block_ms(k) / window` within the limit
(`libs.contracts.device_ms`). The one-host curve is also fitted to the simulator's co-location latency
model (`bench.fleet_colocation.fit`: chunk = solo × (1 + α·(n − 1))) and the fit printed.
"""

from __future__ import annotations

import multiprocessing as mp
import sys
import time
from pathlib import Path
from typing import Any

import msgspec

from bench import fleet_colocation
from bench.common import parser, table, write

KS = (1, 2, 4, 8)


def _host(name: str, tier: int, k: int, blocks: int, threads: int, barrier: Any, out: Any) -> None:
    import torch

    from services.engine_host import colocated
    from services.engine_host.backends import Registry, make_backend

    torch.set_num_threads(threads)
    backend = make_backend(Registry(), name, b"", torch.device("cpu"))
    states = [colocated.scratch_state(backend, seed=i) for i in range(k)]
    colocated.run_blocks(backend, tier, states, 2, threads)  # warm
    barrier.wait()
    t0 = time.perf_counter()
    colocated.run_blocks(backend, tier, states, blocks, threads)
    out.put((t0, time.perf_counter()))


def two_hosts(name: str, tier: int, k: int, blocks: int, threads: int) -> float:
    """Device ms per block with two host processes each running k sessions at once."""
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_host, args=(name, tier, k, blocks, threads, barrier, out)) for _ in range(2)]
    for p in procs:
        p.start()
    spans = [out.get() for _ in procs]
    for p in procs:
        p.join()
    wall = max(e for _, e in spans) - min(s for s, _ in spans)
    return wall * 1000 / (2 * k * blocks)


def one_host(name: str, tier: int, k: int, blocks: int, threads: int) -> float:
    import torch

    from services.engine_host import colocated
    from services.engine_host.backends import Registry, make_backend

    torch.set_num_threads(threads)
    backend = make_backend(Registry(), name, b"", torch.device("cpu"))
    states = [colocated.scratch_state(backend, seed=i) for i in range(k)]
    colocated.run_blocks(backend, tier, states, 2, threads)
    return colocated.run_blocks(backend, tier, states, blocks, threads).wall_ms


SPLITS = ((2, (1, 1)), (4, (2, 2)), (8, (4, 4)), (16, (8, 8)), (16, (10, 6)))


def split(name: str, tier: int, blocks: int, threads: int, rounds: int) -> dict[str, Any]:
    """`--split`: k sessions in one process against the same k split over two processes, both arms
    through `services.engine_host.spread.Probes` (this process and one probe process, each at a host's
    torch threads, all at once), interleaved round by round. Per arm: the device's wall ms per block
    (throughput) and its stage ms per block (every process's stage seconds over the blocks: what the
    hosts' `measured_fraction` sums), the fastest round of each."""
    import torch

    from services.engine_host import spread
    from services.engine_host.backends import Registry, make_backend
    from services.engine_host.backends.base import scratch_state

    torch.set_num_threads(threads)
    registry = Registry()
    backend = make_backend(registry, name, b"", torch.device("cpu"))
    states = [scratch_state(backend, seed=i) for i in range(max(k for k, _ in SPLITS))]
    arms: dict[str, list[Any]] = {}
    arrangements = list(dict.fromkeys(a for k, parts in SPLITS for a in ((k, 0), parts)))  # (here, in the probe)
    with spread.Probes(1, sources=registry.sources, configs={}, device="cpu", threads=threads) as probes:
        for r in range(rounds):
            for share in arrangements:
                label = f"k={sum(share)} {share[0]}/{share[1]}"
                print(f"split {name} t{tier} {label} round {r + 1}", file=sys.stderr)
                arms.setdefault(label, []).append(probes.run(backend, tier, states, share, blocks, threads))
    return {label: {"wall_ms": round(min(x.wall_ms for x in runs), 3),
                    "stage_ms": round(min(x.stage_ms for x in runs), 3),
                    "rounds_stage_ms": [round(x.stage_ms, 3) for x in runs]} for label, runs in arms.items()}


def main() -> None:
    from services.engine_host import torch_threads

    p = parser("colocation", __doc__ or "")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--curve", type=Path, help="also write world t1's one-host curve here, as bench.fleet's "
                   "--colocation-curve reads it")
    p.add_argument("--split", action="store_true", help="only k sessions in one process against the same k "
                   "split over two processes (world t1)")
    args = p.parse_args()
    cores = torch_threads.machine_cores()
    blocks = 10 if args.quick else 30
    if args.split:
        half = torch_threads.default_count(cores, 2)
        out = {"cores": cores, "threads": half, "blocks_per_session": blocks, "rounds": args.rounds,
               "world_t1": split("world", 1, blocks, half, args.rounds)}
        table([(f"world_t1 {label}", f"wall {v['wall_ms']} ms, stage {v['stage_ms']} ms", "per block, device")
               for label, v in out["world_t1"].items()])
        write(args.json, out)
        return
    cases = [("world", 1), ("world", 4), ("dit", 1)]
    res: dict[str, Any] = {"cores": cores, "blocks_per_session": blocks, "ks": list(KS), "rounds": args.rounds}
    rows = []
    for name, tier in cases:
        one: dict[int, list[float]] = {k: [] for k in KS}
        allc: dict[int, list[float]] = {k: [] for k in KS}
        two: dict[int, list[float]] = {k: [] for k in KS}
        for r in range(args.rounds):
            for k in KS:
                print(f"{name} tier {tier} k={k} round {r + 1}", file=sys.stderr)
                half = torch_threads.default_count(cores, 2)
                one[k].append(one_host(name, tier, k, blocks, half))
                allc[k].append(one_host(name, tier, k, blocks, cores))
                two[k].append(two_hosts(name, tier, k, blocks, half))
        key = f"{name}_t{tier}"
        res[key] = {"one_host_block_ms": [round(min(one[k]), 3) for k in KS],
                    "one_host_all_cores_block_ms": [round(min(allc[k]), 3) for k in KS],
                    "two_hosts_device_block_ms": [round(min(two[k]), 3) for k in KS],
                    "two_hosts_per_host_block_ms": [round(2 * min(two[k]), 3) for k in KS],
                    "two_hosts_sessions_on_device": [2 * k for k in KS],
                    "rounds_one_host": {k: [round(x, 3) for x in v] for k, v in one.items()},
                    "rounds_two_hosts": {k: [round(x, 3) for x in v] for k, v in two.items()}}
        curve = fleet_colocation.Curve(source=f"bench.colocation one host, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
                                       backend=name, tier=tier, sessions=KS,
                                       chunk_ms=tuple(res[key]["one_host_block_ms"]))
        fitted = fleet_colocation.fit(curve)
        res[key]["colocation_curve"] = msgspec.to_builtins(curve)
        res[key]["colocation_fit"] = {k: round(v, 4) for k, v in fitted._asdict().items()}
        if args.curve is not None and key == "world_t1":
            args.curve.write_bytes(msgspec.json.encode(curve))
        rows.append((f"{key} one host (k={list(KS)})", res[key]["one_host_block_ms"], "ms/block, min of rounds"))
        rows.append((f"{key} latency model fit", f"alpha {fitted.alpha:.3f}, solo {fitted.solo_ms:.2f} ms, "
                     f"rmse {fitted.rmse_ms:.2f} ms", "chunk = solo × (1 + α·(n − 1))"))
        rows.append((f"{key} one host, all cores", res[key]["one_host_all_cores_block_ms"], "ms/block"))
        rows.append((f"{key} two hosts (device 2k)", res[key]["two_hosts_device_block_ms"], "ms/block, device"))
        rows.append((f"{key} two hosts, per host", res[key]["two_hosts_per_host_block_ms"], "ms/block, one host"))
    table(rows)
    write(args.json, res)


if __name__ == "__main__":
    main()
