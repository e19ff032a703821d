"""Backends benchmark: per registered backend, what a move carries and what a block costs.

    python -m bench.backends [--quick] --json PATH

Per backend (default config): `state_bytes_moved`, `state_bytes_rebuildable`, `state_bytes_static`
(from `state_spec`, nothing allocated), `dirty_fraction_per_block` (moved bytes a block rewrites,
measured as chunk CRCs before and after blocks once the caches are warm, at the chunk size
given), and `block_ms` at each tier (median of bare forwards). For `dit`, a session of a config
whose decoder feature cache is a large share of its state (as Matrix-Game-2's is) is moved over
TCP between engine runtimes: with the cache `moved`, with it `rebuildable` and always rebuilt,
and with it `rebuildable` under the hosts' `auto` choice (send it when the measured rebuild costs
more than its bytes on the wire), the three arms interleaved rep by rep. `move_ms_saved_by_rebuild`
is the moved arm's median minus the rebuilt arm's (register → admit → migrate → verify → commit,
including the destination's rebuild); `rebuild_ms`, `rebuild_ms_full_replay` (the baseline: every
history block through the whole decoder) and `decode_ms_per_block` are timed on one warm state,
interleaved, so the rebuild's cost reads in decoded blocks.

`wan_causal` (an opt-in backend: a host serves it only when configured) is measured at its tiny
random-weight config (`WAN_BENCH_CONFIG`), and `wan_causal_real_scale` gives, for the published
Self-Forcing, LongLive and Matrix-Game-2 shapes in bf16, every per-session leaf's bytes by role from
the spec alone (nothing allocated), beside Worldline's Matrix-Game-2 measurement (`WORLDLINE_MG2`);
`dit_real_scale` gives the same for the reference `dit` at Matrix-Game-2's shape.
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
from libs.checkpoint import clone_tree, trees_equal
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
from services.engine_host.backends.dit import DitConfig, decoder
from services.engine_host.backends.dit import state_spec as dit_state_spec
from services.engine_host.backends.wan_causal import WanCausalConfig, layout
from services.engine_host.profile import chunk_crcs, dirty_bytes
from services.engine_host.runtime import EngineRuntime

DIRTY_CHUNK = 256  # fine enough to see a ring's frame slots in the small default configs
# A dit whose decoder cache is most of its state: 16×22×40 latents decoded through 3 levels.
MOVE_CONFIG = DitConfig(latent_channels=16, latent_h=22, latent_w=40, dim=64, heads=4, layers=4,
                        mouse_dim=32, mouse_heads=2, vae_channels=(64, 32, 16), vae_convs=(2, 2, 2))


WAN_BENCH_CONFIG = WanCausalConfig(random_weights=True, embedder="random")
# Worldline's measurement of Matrix-Game-2 on an RTX 5090 (per session): KV caches resident, the movable
# bit-exact subset and its tensor count, the share of it dirtied per step
WORLDLINE_MG2 = {"kv_resident_bytes": 5.32e9, "movable_bytes": 1.67e9, "movable_tensors": 420,
                 "dirty_fraction_per_step": [0.71, 0.78]}


def real_scale(preset: str) -> dict:
    """Leaves, bytes and roles of one session at a published shape, from the spec alone."""
    return spec_bytes(layout.state_spec(WanCausalConfig(preset=preset, dtype="bfloat16", random_weights=True)))


def spec_bytes(spec: dict) -> dict:
    """A spec's leaves, bytes by group and by role (nothing allocated)."""
    tensors = [(p, t) for p, t in specs.leaves(spec) if isinstance(t, specs.TensorSpec)]
    groups: dict[str, int] = {}
    for p, t in tensors:
        name = p.split("/")[-1] if p.startswith("layers/") else p.split("/")[0]
        group = {"k": "self_attn_kv", "v": "self_attn_kv", "mouse_k": "mouse_kv", "mouse_v": "mouse_kv",
                 "kbd_k": "keyboard_kv", "kbd_v": "keyboard_kv", "cross_k": "cross_attn_kv",
                 "cross_v": "cross_attn_kv"}.get(name, name)
        groups[group] = groups.get(group, 0) + t.nbytes
    return {"leaves": len(tensors), "bytes_by_group": groups,
            "moved_leaves": sum(1 for _, t in tensors if t.role == "moved"),
            **{f"state_bytes_{r}": specs.tensor_bytes(spec, r) for r in specs.ROLES}}


def measure_backend(name: str, registry: Registry, blocks: int) -> dict:
    config = msgspec.msgpack.encode(WAN_BENCH_CONFIG) if name == "wan_causal" else b""
    backend = make_backend(registry, name, config, torch.device("cpu"))
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


async def _move(nc, src: str, dst: str, move_id: str) -> tuple[float, int]:
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
    return (time.perf_counter() - t0) * 1000, r.manifest.total_bytes


ARMS = (("cache_moved", "moved", "rebuild"), ("cache_rebuilt", "rebuildable", "rebuild"),
        ("auto", "rebuildable", "auto"))


async def _pair(nc, arm: str, role: str, policy: str, rebuild_s: float) -> list:
    """Two runtimes serving `MOVE_CONFIG` with its decoder cache of `role`, moving by `policy`, and
    a warm session on the first (its latent history has wrapped: a rebuild replays all of it)."""
    cfg = msgspec.msgpack.encode(msgspec.structs.replace(MOVE_CONFIG, vae_cache_role=role))
    hosts = []
    for h in ("a", "b"):
        rt = EngineRuntime("cpu", host_id=f"{h}-{arm}", backend_configs={"dit": cfg}, rebuild_policy=policy)
        rt.rebuilds.observe(rt.backend("dit"), rebuild_s)  # as the host's start-up profile would
        await rt.start()
        ep = MotionEndpoint(nc, rt.host_id, rt)
        await ep.start()
        inprocess.local_receivers.pop(ep.data_addr)  # TCP, as between machines
        hosts.append((rt, ep))
    rt = hosts[0][0]
    await rt.open(OpenSession(session_id="s", backend="dit", seed=1, tier=1, session_class="C3"))
    await rt.advance("s", 8)
    return hosts


def full_replay(backend, state: dict) -> None:
    """The baseline a rebuild is measured against: every block of the latent history through the
    whole decoder (what the rebuild did before it fed each block only the convolutions that need it)."""
    c = backend.config
    for t in state["vae"]:
        t.zero_()
    end = state["block"] * c.frames_per_block
    for start in range(max(0, end - c.history_frames), end, c.frames_per_block):
        idx = torch.arange(start, start + c.frames_per_block) % c.history_frames
        decoder.decode(c, backend.w, state["vae"], state["latents"].index_select(0, idx))


def time_rebuild(reps: int) -> tuple[float, float, float]:
    """Medians (ms) of a rebuild, of the full-replay baseline and of one block's decode on a warm
    `MOVE_CONFIG` session, interleaved, on one torch thread (a team of two on a busy 2-core machine
    spins more than it computes); each replay must give the live cache's exact bytes."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _time_rebuild(reps)
    finally:
        torch.set_num_threads(threads)


def _time_rebuild(reps: int) -> tuple[float, float, float]:
    backend = make_backend(Registry(), "dit", msgspec.msgpack.encode(MOVE_CONFIG), torch.device("cpu"))
    state = backend.init_state(1, SessionInit(prompt="bench"))
    carries = []
    for _ in range(8):
        carry = backend.denoise(state, backend.encode(state, []), 1)
        backend.decode(state, carry)
        carries.append(carry)
    live = clone_tree(state["vae"])
    rebuild, full, decode = [], [], []
    for _ in range(reps):
        for replay, times in ((backend.rebuild, rebuild), (lambda s: full_replay(backend, s), full)):
            t0 = time.perf_counter()
            replay(state)
            times.append((time.perf_counter() - t0) * 1000)
            assert trees_equal(state["vae"], live), "a replay must rebuild the live cache exactly"
        t0 = time.perf_counter()
        backend.decode(state, carries[-1])  # shape and work of a block's decode (the session is not advanced)
        decode.append((time.perf_counter() - t0) * 1000)
        backend.rebuild(state)  # back to the state's own cache
    return statistics.median(rebuild), statistics.median(full), statistics.median(decode)


async def move_arms(nc, reps: int, rebuild_ms: float) -> dict:
    """Median TCP move time of each arm, the arms interleaved rep by rep (each rep moves every arm's
    session once, back and forth), so a machine that slows down slows every arm alike."""
    pairs = {arm: await _pair(nc, arm, role, policy, rebuild_ms / 1000) for arm, role, policy in ARMS}
    times: dict[str, list[float]] = {arm: [] for arm in pairs}
    wire: dict[str, int] = {}
    try:
        for i in progress(range(reps), reps, "dit moves"):
            order = list(pairs) if i % 2 == 0 else list(reversed(pairs))
            for arm in order:
                (a, _), (b, _) = pairs[arm]
                src, dst = (a, b) if i % 2 == 0 else (b, a)
                ms, total = await _move(nc, src.host_id, dst.host_id, f"{arm}-{i}")
                times[arm].append(ms)
                wire[arm] = total
    finally:
        for hosts in pairs.values():
            for rt, ep in hosts:
                await ep.stop()
                await rt.stop()
    return {arm: (statistics.median(t), wire[arm]) for arm, t in times.items()}


async def main_async(quick: bool) -> dict:
    registry = Registry()
    blocks = 3 if quick else 10
    result: dict = {"backends": {}}
    for name in progress(registry.names(), len(registry.names()), "backends"):
        result["backends"][name] = measure_backend(name, registry, blocks)
    result["wan_causal_real_scale"] = {p: real_scale(p) for p in ("self_forcing", "longlive", "matrix_game_2")}
    result["wan_causal_real_scale"]["worldline_matrix_game_2"] = WORLDLINE_MG2
    # the reference dit at Matrix-Game-2's published shape (its simplified blocks, the same state layout)
    result["dit_real_scale"] = {"matrix_game_2": spec_bytes(dit_state_spec(DitConfig.matrix_game_2()))}
    reps = 3 if quick else 7
    rebuild_ms, full_replay_ms, decode_ms = time_rebuild(reps)
    server = NatsServer(store_dir=Path(tempfile.mkdtemp()) / "nats").start()
    try:
        nc = await bus.connect(server.url, name="bench-backends")
        arms = await move_arms(nc, reps, rebuild_ms)
        await nc.close()
    finally:
        server.stop()
    moved, rebuilt, auto = arms["cache_moved"], arms["cache_rebuilt"], arms["auto"]
    cache_bytes = specs.tensor_bytes(make_backend(registry, "dit", msgspec.msgpack.encode(MOVE_CONFIG),
                                                  torch.device("cpu")).state_spec(), "rebuildable")
    result["backends"]["dit"]["move"] = {
        "config": msgspec.to_builtins(MOVE_CONFIG), "transport": "tcp loopback", "reps": reps,
        "move_ms_cache_moved": moved[0], "move_ms_cache_rebuilt": rebuilt[0], "move_ms_auto": auto[0],
        "wire_bytes_cache_moved": moved[1], "wire_bytes_cache_rebuilt": rebuilt[1], "wire_bytes_auto": auto[1],
        "auto_sent_cache": auto[1] == moved[1], "cache_bytes": cache_bytes,
        "rebuild_threads": 1, "rebuild_ms": rebuild_ms, "rebuild_ms_full_replay": full_replay_ms, "decode_ms_per_block": decode_ms,
        "rebuild_in_decoded_blocks": rebuild_ms / decode_ms, "rebuild_speedup_vs_full_replay": full_replay_ms / rebuild_ms}
    result["backends"]["dit"]["move_ms_saved_by_rebuild"] = moved[0] - rebuilt[0]
    result["backends"]["dit"]["move_ms_saved_by_auto"] = moved[0] - auto[0]
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
    for preset, r in result["wan_causal_real_scale"].items():
        if "leaves" in r:
            rows.append((f"wan_causal {preset} (bf16) moved / rebuildable / static GB",
                         f"{r['state_bytes_moved'] / 1e9:.3f} / {r['state_bytes_rebuildable'] / 1e9:.3f} / "
                         f"{r['state_bytes_static'] / 1e9:.3f}", f"{r['leaves']} leaves, spec only"))
    for preset, r in result["dit_real_scale"].items():
        rows.append((f"dit {preset} (bf16) moved / rebuildable / static GB",
                     f"{r['state_bytes_moved'] / 1e9:.3f} / {r['state_bytes_rebuildable'] / 1e9:.3f} / "
                     f"{r['state_bytes_static'] / 1e9:.3f}", f"{r['leaves']} leaves, spec only"))
    dit = result["backends"]["dit"]
    rows.append(("dit move ms saved by rebuild", dit["move_ms_saved_by_rebuild"],
                 "TCP loopback; negative: the replay costs more than the bytes it saves here"))
    rows.append(("dit move ms saved by auto", dit["move_ms_saved_by_auto"],
                 f"auto sent the cache: {dit['move']['auto_sent_cache']}"))
    rows.append(("dit rebuild ms / full replay ms / decode ms per block",
                 f"{dit['move']['rebuild_ms']:.0f} / {dit['move']['rebuild_ms_full_replay']:.0f} / "
                 f"{dit['move']['decode_ms_per_block']:.0f}", "the rebuild feeds each block only the convolutions it needs"))
    table(rows)
    write(args.json, result)


if __name__ == "__main__":
    main()
