"""Backends benchmark: per registered backend, what a move carries and what a block costs.

    python -m bench.backends [--quick] --json PATH

Per backend (default config): `state_bytes_moved`, `state_bytes_rebuildable`, `state_bytes_static`
(from `state_spec`, nothing allocated), `dirty_fraction_per_block` (moved bytes a block rewrites,
measured as chunk CRCs before and after blocks once the caches are warm, at the chunk size
given), and `block_ms` at each tier (median of bare forwards). For `dit`, a session of a config
whose decoder feature cache is a large share of its state (as Matrix-Game-2's is) is moved over
TCP between two engine runtimes twice, once with the cache `moved` and once `rebuildable`:
`move_ms_saved_by_rebuild` is the difference of the medians (register → admit → migrate → verify →
commit, including the destination's rebuild).
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import msgspec
import torch

from bench.common import parser, progress, table, write
from libs import bus, names
from libs.motion import inprocess
from libs.motion.endpoint import MotionEndpoint
from libs.natsd import NatsServer
from libs.schemas.engine import OpenSession, SessionInit
from libs.schemas.motion import (
    AdmitMove,
    AdmitVerdict,
    Manifest,
    Migrate,
    MigrateResult,
    RegisterState,
    SlotDone,
    SlotRequest,
    Verified,
)
from services.engine_host.backends import Registry, advance, make_backend
from services.engine_host.backends import spec as specs
from services.engine_host.backends.dit import DitConfig
from services.engine_host.profile import chunk_crcs, dirty_bytes
from services.engine_host.runtime import EngineRuntime

DIRTY_CHUNK = 256  # fine enough to see a ring's frame slots in the small default configs
# A dit whose decoder cache is most of its state: 16×22×40 latents decoded through 3 levels.
MOVE_CONFIG = DitConfig(latent_channels=16, latent_h=22, latent_w=40, dim=64, heads=4, layers=4,
                        mouse_dim=32, mouse_heads=2, vae_channels=(64, 32, 16), vae_convs=(2, 2, 2))


def measure_backend(name: str, registry: Registry, blocks: int) -> dict:
    backend = make_backend(registry, name, b"", torch.device("cpu"))
    spec = backend.state_spec()
    state = backend.init_state(1, SessionInit(prompt="bench"))
    moved = specs.select(state, spec)
    top = backend.tiers[-1]
    for _ in range(3):  # warm: a ring of 2 blocks has wrapped
        advance(backend, state, [], top)
    fractions = []
    for _ in range(blocks):
        before = chunk_crcs(moved, DIRTY_CHUNK)
        advance(backend, state, [], top)
        fractions.append(dirty_bytes(before, chunk_crcs(moved, DIRTY_CHUNK)) / specs.tensor_bytes(spec, "moved"))
    block_ms = {}
    for tier in backend.tiers:
        times = []
        for _ in range(blocks):
            t0 = time.perf_counter()
            advance(backend, state, [], tier)
            times.append((time.perf_counter() - t0) * 1000)
        block_ms[str(tier)] = statistics.median(times)
    return {"state_bytes_moved": specs.tensor_bytes(spec, "moved"),
            "state_bytes_rebuildable": specs.tensor_bytes(spec, "rebuildable"),
            "state_bytes_static": specs.tensor_bytes(spec, "static"),
            "dirty_fraction_per_block": statistics.median(fractions), "dirty_chunk_bytes": DIRTY_CHUNK,
            "block_ms": block_ms}


async def _move(nc, src: str, dst: str, move_id: str) -> float:
    t0 = time.perf_counter()
    m = await bus.request(nc, names.engine_subject(src, "register_state"),
                          RegisterState(session_id="s", fingerprint=False), Manifest)
    v = await bus.request(nc, names.engine_subject(dst, "admit"),
                          AdmitMove(session_id="s", move_id=move_id, state_bytes=m.total_bytes, dirty_rate_bps=0.0,
                                    horizon_s=120.0, bandwidth_bps=1e9), AdmitVerdict)
    r = await bus.request(nc, names.engine_subject(src, "migrate"),
                          Migrate(session_id="s", move_id=move_id, dest_host=dst, dest_addr=v.data_addr, token=v.token,
                                  deadline_s=120.0), MigrateResult, timeout_s=150)
    slot = SlotRequest(session_id="s", move_id=move_id, manifest=r.manifest)
    await bus.request(nc, names.engine_subject(dst, "verify"), slot, Verified, timeout_s=60)
    await bus.request(nc, names.engine_subject(dst, "commit"), slot, SlotDone, timeout_s=60)
    await bus.request(nc, names.engine_subject(src, "commit"), SlotRequest(session_id="s", move_id=move_id), SlotDone)
    return (time.perf_counter() - t0) * 1000


async def move_ms(nc, role: str, reps: int) -> tuple[float, int]:
    """Median TCP move time of a warm `MOVE_CONFIG` session with its decoder cache of `role`."""
    cfg = msgspec.msgpack.encode(msgspec.structs.replace(MOVE_CONFIG, vae_cache_role=role))
    hosts = []
    for h in ("a", "b"):
        rt = EngineRuntime("cpu", host_id=f"{h}-{role}", backend_configs={"dit": cfg})
        await rt.start()
        ep = MotionEndpoint(nc, rt.host_id, rt)
        await ep.start()
        inprocess.local_receivers.pop(ep.data_addr)  # TCP, as between machines
        hosts.append((rt, ep))
    try:
        (a, _), (b, _) = hosts
        await a.open(OpenSession(session_id="s", backend="dit", seed=1, tier=1, session_class="C3"))
        await a.advance("s", 8)  # the latent history has wrapped: a rebuild replays all of it
        wire = specs.tensor_bytes(a.backend("dit").state_spec(), "moved")
        times = []
        for i in range(reps):
            src, dst = (a, b) if i % 2 == 0 else (b, a)
            times.append(await _move(nc, src.host_id, dst.host_id, f"{role}-{i}"))
        return statistics.median(times), wire
    finally:
        for rt, ep in hosts:
            await ep.stop()
            await rt.stop()


async def main_async(quick: bool) -> dict:
    registry = Registry()
    blocks = 3 if quick else 10
    result: dict = {"backends": {}}
    for name in progress(registry.names(), len(registry.names()), "backends"):
        result["backends"][name] = measure_backend(name, registry, blocks)
    server = NatsServer(store_dir=Path(tempfile.mkdtemp()) / "nats").start()
    try:
        nc = await bus.connect(server.url, name="bench-backends")
        reps = 3 if quick else 7
        moved_ms, moved_wire = await move_ms(nc, "moved", reps)
        rebuilt_ms, rebuilt_wire = await move_ms(nc, "rebuildable", reps)
        await nc.close()
    finally:
        server.stop()
    result["backends"]["dit"]["move"] = {
        "config": msgspec.to_builtins(MOVE_CONFIG), "transport": "tcp loopback", "reps": reps,
        "move_ms_cache_moved": moved_ms, "move_ms_cache_rebuilt": rebuilt_ms,
        "wire_bytes_cache_moved": moved_wire, "wire_bytes_cache_rebuilt": rebuilt_wire}
    result["backends"]["dit"]["move_ms_saved_by_rebuild"] = moved_ms - rebuilt_ms
    return result


def main() -> None:
    args = parser("backends", __doc__.split("\n\n")[0]).parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    result = asyncio.run(main_async(args.quick))
    rows = []
    for name, r in result["backends"].items():
        rows.append((f"{name} moved / rebuildable MiB",
                     f"{r['state_bytes_moved'] / 2**20:.2f} / {r['state_bytes_rebuildable'] / 2**20:.2f}", ""))
        rows.append((f"{name} dirty fraction per block", r["dirty_fraction_per_block"], ""))
        rows.append((f"{name} block ms by tier", ", ".join(f"{t}: {ms:.1f}" for t, ms in r["block_ms"].items()), ""))
    rows.append(("dit move ms saved by rebuild", result["backends"]["dit"]["move_ms_saved_by_rebuild"],
                 "TCP loopback; negative: the replay costs more than the bytes it saves here"))
    table(rows)
    write(args.json, result)


if __name__ == "__main__":
    main()
