"""The engine host process: one per device. Measures its profile, announces and heartbeats itself
into `sf_engines`, serves session verbs on `sf.engine.<host_id>.<verb>`, and takes the sessions
fence assigns to it (their input arrives only through fence's lease, never through a verb)."""

from __future__ import annotations

import asyncio
import functools
import os
import socket
import time
import tomllib
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
import torch

from libs import bus, names
from libs.checkpoint import CheckpointStore
from libs.config import BaseConfig, PositiveFloat, PositiveInt, section
from libs.errors import ConfigError, Timeout, Unavailable
from libs.fence.client import EngineClient
from libs.motion import machine
from libs.motion.endpoint import MotionEndpoint
from libs.motion.receiver import Limits as DataPlaneLimits
from libs.schemas.base import Msg, encode
from libs.schemas.common import EngineEntry, ProfileRow
from libs.schemas.engine import (
    Advance,
    OpenSession,
    RestoreSession,
    SessionRef,
    StatusRequest,
)
from libs.service import VERSION, Service
from libs.telemetry import traced
from services.engine_host import device_profile, profile, spread, torch_threads
from services.engine_host.assignments import Assignments
from services.engine_host.backends import AvatarConfig, Backend, Registry, WorldConfig
from services.engine_host.costs import shape_of
from services.engine_host.runtime import EngineRuntime

DEFAULT_CPU_STAGING_BYTES = 64 << 20


def staging_bytes(configured: int | None, device: torch.device) -> int:
    """The staging pool's size: as configured, else 64 MiB on a CPU host and none on a GPU host."""
    if configured is not None:
        return configured
    return DEFAULT_CPU_STAGING_BYTES if device.type == "cpu" else 0


class EngineHostConfig(BaseConfig, kw_only=True):
    # Placement declares a host dead after HEARTBEAT_TTL_FACTOR beats without one (1.5 s): the failover
    # budget (docs/placement.md says what it costs the bus).
    heartbeat_s: PositiveFloat = 0.5
    host_id: str = ""
    device: str = "cpu"
    max_sessions: PositiveInt = 64
    max_batch: PositiveInt = 8
    guard_ms: Annotated[float, msgspec.Meta(ge=0)] = 2.0
    # the world model's state per session (0: the small default); sets its window at d_model 256, 4 layers
    world_state_bytes: Annotated[int, msgspec.Meta(ge=0)] = 0
    checkpoint_dir: str = ""  # shared filesystem path for checkpoints over checkpoint_inline_max_bytes
    checkpoint_inline_max_bytes: PositiveInt = 64 << 20
    profile_blocks: PositiveInt = 3  # measured blocks per backend and tier at start-up, after one warm-up
    # The co-location curve's reach: block ms at 1, 2, 4, … concurrent sessions up to this many (and
    # max_sessions); the capacity model extrapolates beyond (0: not measured, priced as one block alone).
    colocated_sessions: Annotated[int, msgspec.Meta(ge=0)] = 8
    # How long a host waits for the device's profile another host of its device is measuring, before it
    # measures its own (device_profile.py).
    device_profile_wait_s: PositiveFloat = 120.0
    verb_timeout_s: PositiveFloat = 30.0
    verb_concurrency: PositiveInt = 16  # requests of one verb (other than input) handled at once
    # torch intra-op threads (0: the machine's cores split between the `hosts_on_machine` engine hosts
    # that share them). Stages already run on their own threads; on a small shared CPU an OpenMP team
    # per stage thread per host oversubscribes the cores.
    torch_threads: Annotated[int, msgspec.Meta(ge=0)] = 0
    # engine hosts sharing this machine's cores (`statefleet up` sets it to the hosts it starts)
    hosts_on_machine: PositiveInt = 1
    checkpoint_every_s: PositiveFloat = 10.0  # fenced sessions are checkpointed this often (for failover)
    orphan_grace_s: PositiveFloat = 5.0  # a copy assigned away and not moved is closed after this long
    data_bind: str = "127.0.0.1:0"  # the mover's TCP data plane (host:port; port 0 picks one)
    # Data-plane limits (libs/motion/receiver.py): open connections, the hello's deadline, silence mid-transfer.
    data_max_connections: PositiveInt = 16
    data_hello_timeout_s: PositiveFloat = 10.0
    data_idle_timeout_s: PositiveFloat = 30.0
    # Pre-faulted arena incoming host-memory moves land in (`libs.motion.pool`), so a move pays no first-touch
    # faults; moved-in states stay in it. Unset: 64 MiB on a CPU host (hundreds of the bundled backends'
    # states; size it for real models: several GiB), none on a GPU host, whose slots live in device memory
    # (the caching allocator reuses it). 0: fresh memory.
    staging_pool_bytes: Annotated[int, msgspec.Meta(ge=0)] | None = None
    # name -> "module:Class": serves a backend no distribution registers, or settles a name that
    # two distributions register under `statefleet.backends` (otherwise a start-up error)
    backend_sources: dict[str, str] = {}
    # name -> that backend's config fields (its `config_type`), e.g. wan_causal's preset and weights_dir,
    # or the path of a TOML file of such tables (SF_BACKEND_CONFIGS under `statefleet up`); a backend not
    # named has its default config (an `opt_in` backend is then not served)
    backend_configs: dict[str, dict[str, Any]] | str = {}
    # The text avatar's voice: "tone" (its own oscillator) or "espeak" (speech from Debian's espeak-ng,
    # `make espeak`); every host serving a session must use the same (a session's bits depend on it).
    avatar_voice: Literal["tone", "espeak"] = "tone"
    # Moves of sessions with `rebuildable` leaves: "auto" sends them when a measured rebuild takes
    # longer than their bytes at move_wire_bps (the rate this host's moves are assumed to get),
    # "rebuild" never sends them, "send" always does (docs/backends.md, "Rebuild or send").
    rebuild_policy: Literal["auto", "rebuild", "send"] = "auto"
    move_wire_bps: PositiveFloat = 1.25e9
    # C1 output at a playout point on the release grid (playout.py): an even period for the viewer, at
    # the price of the hold in control-to-output latency (at most a period). false: publish when done.
    c1_pacing: bool = True
    # Device time a co-tenant outside statefleet is known to take on this device (another job sharing the
    # GPU), announced as part of the measured load (`EngineEntry.measured_fraction`): placement's overload
    # relief then sees it as it sees the stages' own time. The overload stack test stands a noisy neighbour
    # in with it. Admission's prices do not include it.
    co_tenant_fraction: Annotated[float, msgspec.Meta(ge=0)] = 0.0


def backend_tables(value: dict[str, dict[str, Any]] | str) -> dict[str, dict[str, Any]]:
    """`backend_configs` as tables: given inline, or read from the TOML file it names."""
    if isinstance(value, dict):
        return value
    try:
        tables = tomllib.loads(Path(value).read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"backend_configs file {value}: {e}", file=value) from None
    if not all(isinstance(t, dict) for t in tables.values()):
        raise ConfigError(f"backend_configs file {value}: every top-level key must be a [backend] table", file=value)
    return tables


def device_memory(device: torch.device) -> tuple[int, int]:
    """(total, free) bytes of the device's memory; host RAM for `cpu`."""
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        return total, free
    page = os.sysconf("SC_PAGE_SIZE")
    return os.sysconf("SC_PHYS_PAGES") * page, _available_ram(page)


def _available_ram(page: int) -> int:
    """What the kernel can hand out without swapping (MemAvailable), not MemFree: a busy host's page
    cache fills MemFree's gap and would otherwise read as a full machine."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * page


class EngineHostService(Service):
    name = "engine_host"
    config_type = EngineHostConfig

    def __init__(self, config: EngineHostConfig) -> None:
        config.instance_id = config.instance_id or config.host_id or f"{socket.gethostname()}-{config.device}"
        super().__init__(config)
        self.host_id = config.host_id or self.instance
        # This process: claims carry it, and a restart is a new one that inherits no session.
        self.incarnation = uuid.uuid4().hex[:16]
        self.device = torch.device(config.device)
        self.profile: list[ProfileRow] = []

    @property
    def ping_subject(self) -> str:
        return names.engine_subject(self.host_id, "ping")

    @property
    def ping_queue(self) -> str:
        return ""

    async def setup(self) -> None:
        cfg: EngineHostConfig = self.config
        torch_threads.pin(cfg.torch_threads or torch_threads.default_count(torch_threads.machine_cores(),
                                                                           cfg.hosts_on_machine))
        ttl = names.ENGINES_TTL_S  # liveness is placement's to judge; the TTL only clears dead entries
        self.engines_kv = await bus.ensure_kv(self.js, names.ENGINES_BUCKET, ttl_s=ttl, replicas=cfg.nats_replicas)
        objects = await bus.ensure_object_store(self.js, names.CHECKPOINTS_BUCKET, replicas=cfg.nats_replicas)
        store = CheckpointStore(objects, cfg.checkpoint_dir or None, inline_max_bytes=cfg.checkpoint_inline_max_bytes)
        configs = {name: msgspec.msgpack.encode(fields) for name, fields in backend_tables(cfg.backend_configs).items()}
        if cfg.world_state_bytes:
            configs["world"] = msgspec.msgpack.encode(WorldConfig.for_state_bytes(cfg.world_state_bytes))
        if cfg.avatar_voice != "tone":
            configs["avatar"] = msgspec.msgpack.encode(AvatarConfig(voice=cfg.avatar_voice))
        self.runtime = EngineRuntime(self.device, host_id=self.host_id, publish=self._publish, checkpoints=store,
                                     backend_configs=configs, registry=Registry(cfg.backend_sources),
                                     max_batch=cfg.max_batch, guard_s=cfg.guard_ms / 1000,
                                     rebuild_policy=cfg.rebuild_policy, move_wire_bps=cfg.move_wire_bps,
                                     max_sessions=cfg.max_sessions, gate_moved_in=True, c1_pacing=cfg.c1_pacing)
        self.backend_infos = await self.runtime.in_thread(self.runtime.backend_infos)
        self.profile = await self._device_profile(torch.get_num_threads())
        self.runtime.seed_costs(self.profile)
        await self.runtime.start()
        rt = self.runtime
        verbs: list[tuple[str, Any, Callable[[Any], Awaitable[Msg]]]] = [
            ("open", OpenSession, rt.open),
            ("close", SessionRef, lambda r: rt.close(r.session_id, finish=r.finish)),
            ("advance", Advance, lambda r: rt.advance(r.session_id, r.blocks)),
            ("suspend", SessionRef, lambda r: rt.suspend(r.session_id, r.hold_share)),
            ("resume", SessionRef, lambda r: rt.resume(r.session_id)),
            ("checkpoint", SessionRef, lambda r: rt.checkpoint(r.session_id)),
            ("restore", RestoreSession, lambda r: rt.restore(r.session_id, r.key)),
            ("info", SessionRef, self._sync(lambda r: rt.info(r.session_id))),
            ("metrics", SessionRef, self._sync(lambda r: rt.metrics(r.session_id))),
            ("status", StatusRequest, self._sync(lambda _: rt.status())),
        ]
        for verb, req_type, handler in verbs:
            subject = names.engine_subject(self.host_id, verb)
            # Requests handled concurrently, so a long `advance` of one session never holds up another's.
            traced_handler = traced(f"engine.{verb}", self._bounded(verb, handler), host_id=self.host_id)
            await bus.serve(self.nc, subject, req_type, traced_handler, concurrency=cfg.verb_concurrency)
        self.motion = MotionEndpoint(self.nc, self.host_id, rt, cfg.data_bind, staging_bytes=staging_bytes(cfg.staging_pool_bytes, self.device),
                                     data_limits=section(cfg, "data_", DataPlaneLimits))
        self.data_addr = await self.motion.start()
        self.fence = EngineClient(self.nc, self.js, self.host_id, incarnation=self.incarnation,
                                  suspect_after_s=cfg.heartbeat_s * (names.HEARTBEAT_TTL_FACTOR - 1))
        await self.fence.start()
        self.assignments = Assignments(self.fence, rt, checkpoint_every_s=cfg.checkpoint_every_s,
                                       orphan_grace_s=cfg.orphan_grace_s)
        self._taking = self.spawn(self.assignments.run(), "assignments")
        self.log.info("engine_host_ready", host_id=self.host_id, incarnation=self.incarnation,
                      device=str(self.device), torch_threads=torch.get_num_threads(),
                      profile=[(r.backend, r.tier, round(r.quantum_ms, 3)) for r in self.profile])

    async def _device_profile(self, threads: int) -> list[ProfileRow]:
        """This device's rows: measured here by the device's first host, else that host's (device_profile.py)."""
        measure = functools.partial(self.runtime.in_thread, functools.partial(self._measure_profile, threads))
        ident = machine.identity()
        if not ident:  # no boot id: no way to tell which hosts share this device
            return await measure()
        kv = await bus.ensure_kv(self.js, names.DEVICE_PROFILES_BUCKET, ttl_s=names.DEVICE_PROFILES_TTL_S,
                                 replicas=self.config.nats_replicas)
        backends = [self.runtime.backend(info.name) for info in self.backend_infos]
        key = device_profile.device_profile_key(ident, str(self.device), map(shape_of, backends), threads,
                                                processes=self._device_peers() + 1)
        rows, measured = await device_profile.shared_rows(kv, key, self.host_id, measure,
                                                           wait_s=self.config.device_profile_wait_s)
        self.log.info("device_profile", key=key, measured_here=measured, rows=len(rows))
        return rows

    def _measure_profile(self, threads: int) -> list[ProfileRow]:
        return profile.consistent(self._measured_rows(threads))

    def _measured_rows(self, threads: int) -> list[ProfileRow]:
        cfg: EngineHostConfig = self.config
        backends = [self.runtime.backend(info.name) for info in self.backend_infos]
        # every lone block first, before a probe process starts: its start-up would be in them
        rows = [r for b in backends for r in profile.measure(b, blocks=cfg.profile_blocks)]
        if not cfg.colocated_sessions:
            return rows
        peers = self._device_peers()
        if peers:
            try:
                # the device's other host processes, stood in for while its curve is measured (spread.py)
                with spread.Probes(peers, sources=self.runtime.backends.registry.sources,
                                   configs=dict(self.runtime.backends.configs), device=str(self.device),
                                   threads=threads) as probes:
                    return self._curves(backends, rows, threads, probes)
            except spread.ProbeFailed as e:
                self.log.warning("device_profile_spread_failed", error=str(e), peers=peers)
        return self._curves(backends, rows, threads, None)

    def _curves(self, backends: list[Backend], rows: list[ProfileRow], threads: int,
                probes: spread.Probes | None) -> list[ProfileRow]:
        cfg: EngineHostConfig = self.config
        for backend in backends:
            rows = profile.measure_colocated(backend, rows, threads=threads, probes=probes,
                                             max_sessions=min(cfg.colocated_sessions, cfg.max_sessions))
        return rows

    def _device_peers(self) -> int:
        """The other host processes that share this host's device: on a CPU, the machine's other engine
        hosts (`hosts_on_machine`, which `statefleet up` sets); a GPU is one host's."""
        return self.config.hosts_on_machine - 1 if self.device.type == "cpu" else 0

    @staticmethod
    def _sync(fn: Callable[[Any], Msg]) -> Callable[[Any], Awaitable[Msg]]:
        async def handler(req: Any) -> Msg:
            return fn(req)

        return handler

    def _bounded(self, verb: str, handler: Callable[[Any], Awaitable[Msg]]) -> Callable[[Any], Awaitable[Msg]]:
        """The verb as a typed Timeout once it runs past `verb_timeout_s` (inside its span, so the
        span records the timeout)."""
        async def run(req: Any) -> Msg:
            try:
                return await asyncio.wait_for(handler(req), self.config.verb_timeout_s)
            except TimeoutError:
                raise Timeout(f"{verb} did not finish within {self.config.verb_timeout_s}s", verb=verb,
                              session_id=getattr(req, "session_id", "")) from None

        return run

    async def _publish(self, subject: str, payload: bytes) -> None:
        await bus.publish(self.nc, subject, payload)  # a connection that cannot take it: `Unavailable`

    async def heartbeat(self) -> None:
        if self._taking.done():
            # A host that cannot take assignments must not look alive: its entry expires, so
            # placement sends nothing here (the watcher's death is logged by `spawn`).
            raise Unavailable("the assignment watcher is not running", host_id=self.host_id)
        total, free = device_memory(self.device)
        rt = self.runtime
        entry = EngineEntry(host_id=self.host_id, device=str(self.device), memory_bytes=total,
                            free_memory_bytes=free, version=VERSION, heartbeat_at=time.time(),
                            sessions=len(rt.sessions), session_ids=rt.sessions.ids(),
                            profile=rt.refreshed_profile(self.profile),
                            busy_fraction=rt.busy_fraction(), served_fraction=rt.served_fraction(),
                            measured_fraction=rt.measured_fraction() + self.config.co_tenant_fraction,
                            measured_sessions=rt.measured_sessions(), held_fraction=rt.held_fraction(),
                            state_bytes_resident=rt.state_bytes_resident(), data_addr=self.data_addr,
                            backends=self.backend_infos, machine=self.motion.machine,
                            incarnation=self.incarnation, heartbeat_s=self.config.heartbeat_s,
                            threads=torch.get_num_threads())
        await self.engines_kv.put(self.host_id, encode(entry))
        self.fence.heartbeat_landed(time.monotonic())

    async def teardown(self) -> None:
        await self.assignments.stop()
        await self.motion.stop()
        await self.runtime.stop()
        try:
            await self.engines_kv.delete(self.host_id)
        except Exception as e:
            self.log.warning("engine_entry_delete_failed", error=str(e))
