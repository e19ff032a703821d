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


class EngineProcess:
    """`statefleet serve engine_host` as its own process, as `statefleet up` runs it, with quick checkpoints and
    orphan grace, one torch thread (a T0 session's bits are only reproducible on hosts configured alike) and
    `env` on top. `start` again after a kill is the supervisor's restart: same host id, a new incarnation."""

    def __init__(self, url: str, host_id: str, tmp: Path, config: Path | None = None, *, hostname: str = "",
                 **env: str) -> None:
        """`hostname`: run the host in a UTS namespace of its own under that name, so it announces another
        machine (`libs.motion.machine`): another device for capacity, a TCP path for the mover (root only)."""
        self.url, self.host_id, self.tmp, self.config, self.env = url, host_id, tmp, config, env
        self.hostname = hostname
        self.proc: subprocess.Popen | None = None

    def start(self) -> EngineProcess:
        env = {**os.environ, "SF_NATS_URL": self.url, "SF_HOST_ID": self.host_id, "SF_INSTANCE_ID": self.host_id,
               "SF_PROFILE_BLOCKS": "1", "SF_TORCH_THREADS": "1", "SF_CHECKPOINT_DIR": str(self.tmp / "ckpt"),
               "SF_CHECKPOINT_EVERY_S": "0.5", "SF_ORPHAN_GRACE_S": "1.0", "SF_LOG_JSON": "true", **self.env}
        log = open(self.tmp / f"{self.host_id}.log", "ab")  # noqa: SIM115 - the child owns it
        args = [sys.executable, "-m", "statefleet", "serve", "engine_host"]
        if self.config is not None:  # a TOML file for what the environment cannot say (tables)
            args += ["--config", str(self.config)]
        if self.hostname:  # the shell execs the host: the process is the host's, signals and all
            args = ["unshare", "--uts", "sh", "-c", f'hostname {self.hostname} && exec "$0" "$@"', *args]
        self.proc = subprocess.Popen(args, env=env, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        log.close()
        return self

    async def ready(self, nc, timeout_s: float = 90.0) -> None:
        """Wait until the host answers its ping; fail at once if it exited."""
        from libs.schemas.common import Ping, Pong
        for _ in range(int(timeout_s / 0.25)):
            assert self.proc is not None and self.proc.poll() is None, f"{self.host_id} exited; see its log"
            with contextlib.suppress(Exception):
                await bus.request(nc, names.engine_subject(self.host_id, "ping"), Ping(), Pong, timeout_s=0.5)
                return
            await asyncio.sleep(0.25)
        raise AssertionError(f"{self.host_id} never answered ping")

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        assert self.proc is not None
        self.proc.wait()

    def stop(self) -> None:
        """At the end of a test: gone, whether running, stopped (SIGSTOP) or already dead."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def hosts(nats_server, tmp_path):
    """`hosts(host_id, **env)`: an engine-host process started (not yet ready: `await h.ready(nc)`), with
    half-second heartbeats and plain-text logs; all stopped after the test."""
    started: list[EngineProcess] = []

    def start(host_id: str, **env: str) -> EngineProcess:
        h = EngineProcess(nats_server.url, host_id, tmp_path, SF_HEARTBEAT_S="0.5", SF_LOG_JSON="false",
                          **env).start()
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
