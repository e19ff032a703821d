"""The process shell every service shares: connect, provision, answer ping, heartbeat, stop in order.

A service subclasses `Service`, sets `name` and `config_type`, and overrides
`setup` (subscribe, provision its streams) and `teardown`. The pure decision
logic lives elsewhere; this is the thin asyncio shell around it.
"""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import socket
import time
import uuid
from typing import ClassVar

import structlog

from libs import bus, logs, metrics_http, names, telemetry
from libs.config import BaseConfig
from libs.schemas.base import encode
from libs.schemas.common import Ping, Pong, ServiceEntry
from libs.tasks import cancel_and_wait, report_death

VERSION = "0.1.0"
STOP_STEP_TIMEOUT_S = 20.0


class Service:
    name: ClassVar[str]
    config_type: ClassVar[type[BaseConfig]] = BaseConfig

    def __init__(self, config: BaseConfig) -> None:
        self.config = config
        self.instance = config.instance_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:4]}"
        self.started_at = time.time()
        self.log = structlog.get_logger(f"statefleet.{self.name}").bind(service=self.name, instance=self.instance)
        self.nc: bus.Client
        self.js: bus.JetStream
        self._services_kv: bus.KeyValue
        self._tasks: list[asyncio.Task] = []
        self._stopping = asyncio.Event()
        self._metrics = None
        self.metrics_port = -1

    # -------------------------------------------------------------- hooks

    @property
    def ping_subject(self) -> str:
        return names.ping_subject(self.name)

    @property
    def ping_queue(self) -> str:
        return self.name

    async def setup(self) -> None:
        """Subscribe and provision what this service owns."""

    async def teardown(self) -> None:
        """Stop taking work and release what `setup` took, before the bus connection drains."""

    async def heartbeat(self) -> None:
        """Called every `heartbeat_s` after the service entry is refreshed."""

    # -------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        cfg = self.config
        self.nc = await bus.connect(cfg.nats_url, name=f"{self.name}:{self.instance}",
                                    connect_timeout_s=cfg.nats_connect_timeout_s,
                                    user=cfg.nats_user, password=cfg.nats_password,
                                    tls=bus.tls_context(cfg.nats_tls_ca_file, cfg.nats_tls_cert_file,
                                                        cfg.nats_tls_key_file))
        self.js = self.nc.jetstream()
        ttl = cfg.heartbeat_s * names.HEARTBEAT_TTL_FACTOR
        self._services_kv = await bus.ensure_kv(self.js, names.SERVICES_BUCKET, ttl_s=ttl,
                                                replicas=cfg.nats_replicas)
        await self.setup()
        if cfg.metrics_port >= 0:
            telemetry.setup(self.name, cfg.telemetry_exporter, cfg.otlp_endpoint, prometheus=True)
            wanted = cfg.metrics_port + cfg.metrics_port_offset if cfg.metrics_port else 0
            self._metrics, self.metrics_port = await metrics_http.start(cfg.metrics_host, wanted, log=self.log)
            self.log.info("metrics_listening", host=cfg.metrics_host, port=self.metrics_port)
        # Ping last: an answer means every verb `setup` serves is subscribed (callers use it as readiness).
        await bus.serve(self.nc, self.ping_subject, Ping, self._on_ping, queue=self.ping_queue)
        await self._beat()
        self.spawn(self._heartbeat_loop(), "heartbeat")
        self.log.info("service_started", nats_url=bus.redacted(cfg.nats_url), version=VERSION)

    async def stop(self) -> None:
        self._stopping.set()
        try:  # a stop that cannot finish must not hang the process (a supervisor would kill it anyway)
            await asyncio.wait_for(self.teardown(), STOP_STEP_TIMEOUT_S)
        except TimeoutError:
            self.log.error("teardown_timed_out", timeout_s=STOP_STEP_TIMEOUT_S)
        if self._metrics is not None:
            await self._metrics.cleanup()
        await cancel_and_wait(self._tasks, timeout_s=STOP_STEP_TIMEOUT_S)
        try:
            await self._services_kv.delete(self._entry_key)
        except Exception as e:  # the entry expires by TTL anyway
            self.log.warning("service_entry_delete_failed", error=str(e))
        try:
            await asyncio.wait_for(self.nc.drain(), STOP_STEP_TIMEOUT_S)
        except TimeoutError:
            self.log.error("drain_timed_out", timeout_s=STOP_STEP_TIMEOUT_S)
            await self.nc.close()
        self.log.info("service_stopped")

    async def run_until_signalled(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._stopping.set)
        await self.start()
        # The service is this process's one long-lived thing: what start-up built (imported modules, torch
        # alone ~150k objects; connections, mirrors) lives as long as the process. Out of the collector's
        # generations, a full collection, which a busy loop's allocations set off now and then, no longer
        # walks it (bench.placement: one took a 1,024-host fleet decision's p99 from ~7 to ~90 ms). Not in
        # `start`: a process that starts and stops many services (the tests) would keep their garbage.
        gc.freeze()
        await self._stopping.wait()
        await self.stop()

    def spawn(self, coro, name: str) -> asyncio.Task:
        """A background task owned by the service: cancelled on stop, its crash logged."""
        task = asyncio.create_task(coro, name=f"{self.name}:{name}")
        task.add_done_callback(report_death("background_task_failed", self.log))
        self._tasks.append(task)
        return task

    # -------------------------------------------------------------- ping and heartbeat

    @property
    def _entry_key(self) -> str:
        return f"{self.name}.{self.instance}"

    async def _on_ping(self, _: Ping) -> Pong:
        return Pong(service=self.name, instance=self.instance, version=VERSION,
                    uptime_s=time.time() - self.started_at)

    async def _beat(self) -> None:
        entry = ServiceEntry(service=self.name, instance=self.instance, version=VERSION,
                             hostname=socket.gethostname(), pid=os.getpid(),
                             started_at=self.started_at, heartbeat_at=time.time(), metrics_port=self.metrics_port)
        await self._services_kv.put(self._entry_key, encode(entry))
        await self.heartbeat()

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.heartbeat_s)
            try:
                await self._beat()
            except Exception as e:  # a NATS outage must not kill the service; beats resume on reconnect
                self.log.warning("heartbeat_failed", error=str(e) or type(e).__name__)


def run(service_type: type[Service], config: BaseConfig) -> None:
    """Run a service in the foreground until SIGINT/SIGTERM."""
    logs.setup(config.log_level, json=config.log_json)
    telemetry.setup(service_type.name, config.telemetry_exporter, config.otlp_endpoint,
                    prometheus=config.metrics_port >= 0)
    asyncio.run(service_type(config).run_until_signalled())
