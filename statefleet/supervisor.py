"""`statefleet up`: embedded NATS, every service and the engine hosts, supervised in one process tree.

Children run in their own sessions so a terminal's Ctrl-C reaches only the
supervisor, which then stops them in order: engine hosts, then services, then
NATS. Children also carry PR_SET_PDEATHSIG, so even a killed supervisor leaves
no process behind. A child that crashes is restarted with backoff; one that
keeps crashing stops the whole tree with a non-zero exit. The embedded
nats-server is restarted the same way, on the same port and data dir, with
per-service users (`libs/bus_auth.py`); the services ride out the gap.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from libs import bus, bus_auth, names
from libs.errors import Unavailable
from libs.natsd import NatsServer
from libs.procs import die_with_parent
from services.placement.provisioning.local import wanted
from statefleet import admin_token

# Fixed HTTP ports for the two HTTP front doors (override with SF_*_HTTP_PORT in the environment).
HTTP_PORTS = {"admission": 8700, "fence": 8701}
# Prometheus /metrics of each process: services at base + their index, engine host i at base + 10 + i
# (base 9700; SF_METRICS_BASE_PORT overrides it, 0 gives every process a free port of its own).
METRICS_BASE_PORT = 9700
# Placement runs as this many instances: none is special, so losing one mid-failover loses nothing.
PLACEMENT_INSTANCES = 2
RESTART_LIMIT = 5
RESTART_WINDOW_S = 60.0
STOP_GRACE_S = 10.0


def _count_restart(restarts: list[float]) -> list[float]:
    """The restart times within the window, this one included."""
    now = time.monotonic()
    return [t for t in restarts if now - t < RESTART_WINDOW_S] + [now]


@dataclass
class Child:
    name: str
    env: dict[str, str]
    log_path: Path
    proc: subprocess.Popen | None = None
    restarts: list[float] = field(default_factory=list)
    wanted: bool = True  # autoscaled engine hosts: False once the provisioner gave it back
    stop_sent_at: float = 0.0

    @property
    def service(self) -> str:
        return "engine_host" if self.name.startswith("engine") else self.name.split("-")[0]

    def start(self) -> None:
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child owns it from here
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "statefleet", "serve", self.service],
            env={**os.environ, **self.env}, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
            start_new_session=True, preexec_fn=die_with_parent,
        )
        log.close()

    def signal(self, sig: int) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)


class Supervisor:
    def __init__(self, *, data_dir: str, nats_url: str, engines: int, device: str,
                 autoscale: tuple[int, int] | None = None) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.nats_url = nats_url
        # With autoscaling, `engines` is the most hosts the fleet may grow to; placement's `local`
        # provisioner says which of them run (a file per wanted host in provision_dir).
        self.autoscale = autoscale
        self.engines = autoscale[1] if autoscale else engines
        self.provision_dir = self.data_dir / "provision"
        self.device = device
        self.nats: NatsServer | None = None
        self.nats_restarts: list[float] = []
        self.credentials: dict[str, bus_auth.Credential] = {}
        self.children: list[Child] = []
        self.admin_token = ""
        self._stop_requested = False

    def run(self) -> int:
        signal.signal(signal.SIGINT, self._request_stop)
        signal.signal(signal.SIGTERM, self._request_stop)
        (self.data_dir / "logs").mkdir(parents=True, exist_ok=True)
        try:
            self._start_nats()
            self.admin_token = admin_token.ensure(self.data_dir)
            self._start_children()
            self._print_table()
            return self._watch()
        finally:
            self._stop_all()

    def _request_stop(self, *_: object) -> None:
        self._stop_requested = True

    @property
    def host_ids(self) -> list[str]:
        return [f"engine-{i}" for i in range(self.engines)]

    def _start_nats(self) -> None:
        url_file = self.data_dir / "nats.url"
        if self.nats_url:
            url_file.write_text(self.nats_url + "\n")
            return
        # Embedded: every process gets its own NATS user; the CLI's credentials go in nats.url (0600).
        self.credentials = bus_auth.write_auth(self.data_dir / "nats" / "auth", self.host_ids)
        self.nats = NatsServer(store_dir=self.data_dir / "nats",
                               config_file=self.data_dir / "nats" / "auth" / "auth.conf").start()
        self.nats_url = self.nats.url
        url_file.touch(mode=0o600)
        url_file.chmod(0o600)
        url_file.write_text(bus_auth.url_with(self.nats_url, self.credentials[bus_auth.CLI_USER]) + "\n")

    def _auth_env(self, service: str, host_id: str = "") -> dict[str, str]:
        if not self.credentials:
            return {}
        cred = self.credentials[bus_auth.user_for(service, host_id)]
        return {"SF_NATS_USER": cred.user, "SF_NATS_PASSWORD": cred.password}

    @staticmethod
    def _service_children() -> list[tuple[str, str]]:
        """(process name, service) for every service process: placement runs as several instances."""
        out = []
        for name in (n for n in names.SERVICES if n != "engine_host"):
            count = PLACEMENT_INSTANCES if name == "placement" else 1
            out += [(f"{name}-{i}" if count > 1 else name, name) for i in range(count)]
        return out

    def _autoscale_env(self) -> dict[str, str]:
        if not self.autoscale:
            return {}
        return {"SF_PROVISIONER": "local", "SF_PROVISION_DIR": str(self.provision_dir),
                "SF_PROVISION_HOSTS": ",".join(self.host_ids), "SF_MIN_HOSTS": str(self.autoscale[0]),
                "SF_MAX_HOSTS": str(self.autoscale[1])}

    def _initial_hosts(self) -> None:
        """The first MIN hosts are wanted from the start; what an earlier run wanted is forgotten."""
        self.provision_dir.mkdir(parents=True, exist_ok=True)
        for f in self.provision_dir.iterdir():
            f.unlink()
        for host_id in self.host_ids[: self.autoscale[0]]:
            (self.provision_dir / host_id).touch()

    def _start_children(self) -> None:
        base = {"SF_NATS_URL": self.nats_url, "SF_LOG_JSON": "true"}
        if self.autoscale:
            self._initial_hosts()
        page = f"http://127.0.0.1:{self._http_port('admission')}"
        metrics = int(os.environ.get("SF_METRICS_BASE_PORT", METRICS_BASE_PORT))
        for i, (child, name) in enumerate(self._service_children()):
            env = {**base, **self._auth_env(name), "SF_INSTANCE_ID": child if "-" in child else f"{name}-0",
                   "SF_METRICS_PORT": str(metrics and metrics + i)}
            if name in HTTP_PORTS:
                env["SF_HTTP_PORT"] = self._http_port(name)
            if name == "admission":  # clients are told where fence's ingress is
                env["SF_INGRESS_URL"] = f"http://127.0.0.1:{self._http_port('fence')}"
                # the one admin credential; the CLI reads it from the same file (admin_token.py)
                env[admin_token.ENV] = self.admin_token
            if name == "placement":
                env.update(self._autoscale_env())
            if name == "fence":  # the pages admission serves may open session sockets
                env["SF_ALLOWED_ORIGINS"] = f"{page},{page.replace('127.0.0.1', 'localhost')}"
            self.children.append(Child(child, env, self.data_dir / "logs" / f"{child}.log"))
        for i, host_id in enumerate(self.host_ids):
            device = f"cuda:{i}" if self.device == "cuda" else self.device
            env = {**base, **self._auth_env("engine_host", host_id),
                   "SF_HOST_ID": host_id, "SF_INSTANCE_ID": host_id, "SF_DEVICE": device,
                   "SF_CHECKPOINT_DIR": str(self.data_dir / "checkpoints"),
                   # every host shares this machine's cores: each takes its share of torch threads
                   "SF_HOSTS_ON_MACHINE": str(self.engines),
                   "SF_METRICS_PORT": str(metrics and metrics + 10 + i)}
            self.children.append(Child(f"engine-{i}", env, self.data_dir / "logs" / f"engine-{i}.log"))
        want = wanted(self.provision_dir, self.host_ids) if self.autoscale else None
        for child in self.children:
            child.wanted = want is None or child.service != "engine_host" or child.env["SF_HOST_ID"] in want
            if child.wanted:
                child.start()

    @staticmethod
    def _http_port(service: str) -> str:
        return os.environ.get(f"SF_{service.upper()}_HTTP_PORT", str(HTTP_PORTS[service]))

    def _print_table(self) -> None:
        print(f"statefleet up — NATS {bus.redacted(self.nats_url)}" + (" (embedded)" if self.nats else " (external)"))
        print(f"{'process':<12} {'pid':>7}  {'where':<28} log")
        if self.nats:
            print(f"{'nats-server':<12} {self.nats.proc.pid:>7}  {self.nats_url:<28} {self.nats.log_path}")
        for c in self.children:
            if c.proc is None:
                print(f"{c.name:<12} {'-':>7}  {'(autoscaled: not started)':<28} {c.log_path}")
                continue
            where = c.env.get("SF_DEVICE") or (f"http://127.0.0.1:{c.env['SF_HTTP_PORT']}"
                                               if "SF_HTTP_PORT" in c.env else "bus only")
            print(f"{c.name:<12} {c.proc.pid:>7}  {where:<28} {c.log_path}")
        page = f"http://127.0.0.1:{self._http_port('admission')}"
        print(f"session page     {page}/session")
        # the admin token in the URL's fragment: a browser never sends a fragment to a server (docs/web.md)
        fragment = f"#token={self.admin_token}" if self.admin_token else ""
        print(f"fleet dashboard  {page}/dashboard{fragment}  (admin token in {self.data_dir / admin_token.FILE})")
        ports = sorted(int(c.env["SF_METRICS_PORT"]) for c in self.children)
        where = f"ports {ports[0]}..{ports[-1]}" if ports[-1] else "a free port each (see the logs)"
        print(f"metrics          http://127.0.0.1:PORT/metrics on {where} (Prometheus)")
        print("`statefleet status` shows the fleet; Ctrl-C stops everything.", flush=True)

    def _watch(self) -> int:
        while not self._stop_requested:
            time.sleep(0.25)
            if self.nats and self.nats.proc.poll() is not None and not self._stop_requested:
                if not self._restart_nats():
                    return 1
            if self.autoscale:
                self._reconcile_engines()
            for c in self.children:
                if c.proc is None or c.proc.poll() is None or self._stop_requested or not c.wanted:
                    continue
                c.restarts = _count_restart(c.restarts)
                if len(c.restarts) > RESTART_LIMIT:
                    print(f"{c.name} crashed {RESTART_LIMIT} times in {RESTART_WINDOW_S:.0f}s; stopping "
                          f"(see {c.log_path})", file=sys.stderr)
                    return 1
                print(f"{c.name} exited with {c.proc.returncode}; restarting", file=sys.stderr, flush=True)
                c.start()
        return 0

    def _reconcile_engines(self) -> None:
        """Start the engine hosts placement's provisioner now wants; stop (TERM, then KILL) the ones it gave back."""
        want = wanted(self.provision_dir, self.host_ids)
        now = time.monotonic()
        for c in (c for c in self.children if c.service == "engine_host"):
            if c.env["SF_HOST_ID"] in want and not c.wanted:
                c.wanted, c.restarts = True, []
                c.start()
                print(f"{c.name} started (autoscaled, pid {c.proc.pid})", flush=True)
            elif c.env["SF_HOST_ID"] not in want and c.wanted:
                c.wanted, c.stop_sent_at = False, now
                c.signal(signal.SIGTERM)
                print(f"{c.name} stopping (autoscaled)", flush=True)
            elif not c.wanted and c.proc is not None and c.proc.poll() is None and now - c.stop_sent_at > STOP_GRACE_S:
                c.proc.kill()

    def _restart_nats(self) -> bool:
        """Start NATS again on its port and data dir; the services reconnect on their own."""
        print(f"nats-server exited ({self.nats.proc.returncode}); restarting", file=sys.stderr, flush=True)
        self.nats_restarts = _count_restart(self.nats_restarts)
        if len(self.nats_restarts) > RESTART_LIMIT:
            print(f"nats-server crashed {RESTART_LIMIT} times in {RESTART_WINDOW_S:.0f}s; stopping "
                  f"(see {self.nats.log_path})", file=sys.stderr)
            return False
        try:
            self.nats.start()
        except Unavailable as e:
            print(f"nats-server did not restart: {e}; stopping", file=sys.stderr)
            return False
        print(f"nats-server restarted (pid {self.nats.proc.pid}) on {self.nats.url}", file=sys.stderr, flush=True)
        return True

    def _stop_all(self) -> None:
        engines = [c for c in self.children if c.service == "engine_host"]
        services = [c for c in self.children if c.service != "engine_host"]
        for group in (engines, services):
            for c in group:
                c.signal(signal.SIGTERM)
            deadline = time.monotonic() + STOP_GRACE_S
            for c in group:
                if c.proc is None:
                    continue
                try:
                    c.proc.wait(max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    c.proc.kill()
                    c.proc.wait()
        if self.nats:
            self.nats.stop()
        print("statefleet stopped", flush=True)
