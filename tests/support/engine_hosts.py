"""Engine hosts for stack tests (issue 22: shared from here): `statefleet serve engine_host` as its own process
(so a test can SIGKILL, SIGSTOP or restart it) through the `hosts` fixture, or one in this process
(`start_host`)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from libs import bus, names
from services.engine_host.service import EngineHostConfig, EngineHostService


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Engine tests run torch with one intra-op thread: stages already run on their own threads, and on a
    shared 2-core CI machine an OpenMP team per thread oversubscribes the cores (blocks 20-60x slower).
    Autouse where a conftest.py or test module imports it."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


class HostProcess:
    """`statefleet serve engine_host` as its own process. Every host runs one torch thread: a T0
    session's bits are only reproducible on hosts configured alike."""

    def __init__(self, url: str, host_id: str, tmp_path: Path, **env: str) -> None:
        self.host_id = host_id
        self.log = open(tmp_path / f"{host_id}.log", "w")  # noqa: SIM115 (closed in stop)
        base = {"SF_NATS_URL": url, "SF_HOST_ID": host_id, "SF_INSTANCE_ID": host_id, "SF_PROFILE_BLOCKS": "1",
                "SF_TORCH_THREADS": "1", "SF_CHECKPOINT_DIR": str(tmp_path / "ckpt"), "SF_HEARTBEAT_S": "0.5",
                "SF_CHECKPOINT_EVERY_S": "0.5", "SF_ORPHAN_GRACE_S": "1.0", "SF_LOG_JSON": "false"}
        self.proc = subprocess.Popen([sys.executable, "-m", "statefleet", "serve", "engine_host"],
                                     env={**os.environ, **base, **env}, stdout=self.log, stderr=subprocess.STDOUT)

    async def ready(self, nc, timeout_s: float = 90.0) -> None:
        from libs.schemas.common import Ping, Pong
        for _ in range(int(timeout_s / 0.25)):
            assert self.proc.poll() is None, f"{self.host_id} exited; see its log"
            with contextlib.suppress(Exception):
                await bus.request(nc, names.engine_subject(self.host_id, "ping"), Ping(), Pong, timeout_s=0.5)
                return
            await asyncio.sleep(0.25)
        raise AssertionError(f"{self.host_id} never answered ping")

    def signal(self, sig: int) -> None:
        os.kill(self.proc.pid, sig)

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


@pytest.fixture
def hosts(nats_server, tmp_path):
    started: list[HostProcess] = []

    def start(host_id: str, **env: str) -> HostProcess:
        h = HostProcess(nats_server.url, host_id, tmp_path, **env)
        started.append(h)
        return h

    yield start
    for h in started:
        h.stop()


async def start_host(url: str, host_id: str, tmp_path, **kw) -> EngineHostService:
    """An engine host in this process with quick heartbeats, checkpoints and orphan grace."""
    base = dict(nats_url=url, host_id=host_id, heartbeat_s=0.5, profile_blocks=1,
                checkpoint_dir=str(tmp_path / "ckpt"), checkpoint_every_s=0.3, orphan_grace_s=0.5, log_json=False)
    cfg = EngineHostConfig(**{**base, **kw})
    svc = EngineHostService(cfg)
    await svc.start()
    return svc
