"""A whole statefleet stack as `statefleet up` runs it, in a subprocess, for chaos tests and bench.load.

The supervisor is part of what is under test: when a child is killed it restarts it, so "resumed
without operator action" is the product's own behaviour, not something a harness does. Children
are found by their parent pid (the `up` process) and their command line, so a test can signal one
process without touching any other.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from libs import bus, errors, names
from libs.natsd import free_port
from libs.procs import die_with_parent
from libs.schemas.common import Ping, Pong
from libs.schemas.placement import HostList, HostsRequest
from statefleet import admin_token

# Consecutive answers from placement that list every engine host up before a stack counts as ready.
PLACEMENT_AGREES = 6


def children_of(pid: int) -> dict[int, list[str]]:
    """Direct children of `pid` → their argv, read from /proc."""
    out: dict[int, list[str]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            if ppid == pid:
                out[int(entry.name)] = (entry / "cmdline").read_bytes().decode().rstrip("\0").split("\0")
        except (OSError, ValueError, IndexError):
            continue  # exited while we looked
    return out


@dataclass
class UpStack:
    """`statefleet up --data-dir DIR --engines N [--nats-url URL] [--autoscale MIN:MAX]` with its own HTTP ports."""

    data_dir: Path
    engines: int = 2  # with `autoscale`: the MIN hosts it starts with
    nats_url: str = ""
    env: dict[str, str] = field(default_factory=dict)
    autoscale: str = ""  # "MIN:MAX": placement starts and stops engine hosts itself
    admission_port: int = field(default_factory=free_port)
    fence_port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None
    _out: object = None

    @property
    def admission_url(self) -> str:
        return f"http://127.0.0.1:{self.admission_port}"

    @property
    def host_ids(self) -> list[str]:
        return [f"engine-{i}" for i in range(self.engines)]

    def start(self) -> UpStack:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        # `ready` waits for `up` to write the URL: one left by an earlier run on this data dir is stale.
        (self.data_dir / "nats.url").unlink(missing_ok=True)
        args = [sys.executable, "-m", "statefleet", "up", "--data-dir", str(self.data_dir),
                "--engines", str(self.engines)]
        if self.nats_url:
            args += ["--nats-url", self.nats_url]
        if self.autoscale:
            args += ["--autoscale", self.autoscale]
            self.engines = int(self.autoscale.split(":")[0])
        # Every port its own (free) one, so stacks can run side by side.
        env = {**os.environ, "SF_ADMISSION_HTTP_PORT": str(self.admission_port),
               "SF_FENCE_HTTP_PORT": str(self.fence_port), "SF_METRICS_BASE_PORT": "0", **self.env}
        self._out = open(self.data_dir / "up.out", "w")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(args, stdout=self._out, stderr=subprocess.STDOUT, text=True, env=env,
                                     preexec_fn=die_with_parent)  # a killed harness leaves no stack behind
        return self

    def admin_headers(self) -> dict[str, str]:
        """The stack's admin credential (session creation needs one), as a request header."""
        return {"Authorization": f"Bearer {admin_token.read(self.data_dir)}"}

    def cli_url(self) -> str:
        """The operator's NATS URL `up` wrote (with the `cli` user's credentials when it embeds NATS)."""
        return (self.data_dir / "nats.url").read_text().strip()

    async def ready(self, timeout_s: float = 180.0) -> None:
        """Every service and engine host answers ping, and placement sees every engine host up."""
        deadline = time.monotonic() + timeout_s
        url_file = self.data_dir / "nats.url"
        while not (url_file.exists() and url_file.read_text().strip()):
            self._alive()
            if time.monotonic() > deadline:
                raise TimeoutError("statefleet up wrote no nats.url")
            await asyncio.sleep(0.2)
        nc = await bus.connect(self.cli_url(), name="stack-probe")
        try:
            subjects = [names.ping_subject(s) for s in ("fence", "admission", "placement", "mover")]
            subjects += [names.engine_subject(h, "ping") for h in self.host_ids]
            pending = set(subjects)
            while pending:
                self._alive()
                if time.monotonic() > deadline:
                    raise TimeoutError(f"not ready: {sorted(pending)}")
                for subject in list(pending):
                    if await answers(nc, subject, timeout_s=1.0):
                        pending.discard(subject)
                await asyncio.sleep(0.25)
            # Ready means placement can place on every host: each placement instance learns of a host from
            # its own watch of the heartbeats, so a heartbeat in the bucket is not yet a host placement
            # sees. Answers come from either instance (a queue group): several in a row, all listing every
            # host up, leave an unasked instance's watch behind by less than the run of asks took.
            in_a_row = 0
            while in_a_row < PLACEMENT_AGREES:
                self._alive()
                if time.monotonic() > deadline:
                    raise TimeoutError("placement does not see every engine host up")
                try:
                    listed = await bus.request(nc, names.PLACEMENT_HOSTS, HostsRequest(), HostList, timeout_s=2.0)
                    up = {h.host_id for h in listed.hosts if h.state == "up"}
                except errors.StatefleetError:
                    up = set()
                in_a_row = in_a_row + 1 if set(self.host_ids) <= up else 0
                await asyncio.sleep(0.1 if in_a_row else 0.25)
        finally:
            await nc.close()

    def violations(self) -> list[str]:
        """Every bus permission refusal a service logged: each is a missing grant (a read that only
        times out on the client's side), never something a healthy stack does."""
        out = []
        for path in sorted((self.data_dir / "logs").glob("*.log")):
            out += [f"{path.name}: {line.strip()}" for line in path.read_text(errors="replace").splitlines()
                    if "permissions violation" in line.lower()]
        return out

    def _alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"statefleet up exited with {self.proc.returncode}; see {self.data_dir / 'up.out'}")

    def pid_of(self, name: str) -> int:
        """The pid of the child running `name`: a service name, `engine-<i>`, or `nats-server`."""
        assert self.proc is not None
        for pid, argv in children_of(self.proc.pid).items():
            if name == "nats-server" and argv and argv[0].endswith("nats-server"):
                return pid
            if argv[-2:] == ["serve", name]:
                return pid
            if name.startswith("engine-") and argv[-2:] == ["serve", "engine_host"] \
                    and _env_of(pid).get("SF_HOST_ID") == name:
                return pid
        raise LookupError(f"no running child {name!r}")

    def signal(self, name: str, sig: int) -> int:
        pid = self.pid_of(name)
        os.kill(pid, sig)
        return pid

    def stop(self, timeout_s: float = 60.0) -> str:
        """Ctrl-C, as an operator stops it; returns what `up` printed."""
        if self.proc is not None and self.proc.poll() is None:
            for pid in children_of(self.proc.pid):  # a child left SIGSTOPped must be able to stop
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._out is not None:
            self._out.close()
        return (self.data_dir / "up.out").read_text()


def _env_of(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
    except OSError:
        return {}
    return dict(kv.split("=", 1) for kv in raw.split("\0") if "=" in kv)


async def answers(nc: bus.Client, subject: str, timeout_s: float = 0.5) -> bool:
    """Whether whoever serves the ping verb `subject` answers now (a process still starting does not)."""
    try:
        with bus.unavailable(f"ping on {subject}"):  # whatever else the bus says: not answering yet
            await bus.request(nc, subject, Ping(), Pong, timeout_s=timeout_s)
        return True
    except errors.StatefleetError:
        return False
