"""The `statefleet` command as a user runs it: start-up failures, `up`, `status`, ping, Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from libs import bus, names
from libs.natsd import free_port
from libs.schemas.common import Ping, Pong


def statefleet(*args: str, env: dict | None = None, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "statefleet", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def test_unreachable_nats_fails_fast_with_one_clear_line():
    url = f"nats://127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    r = statefleet("serve", "fence", "--nats-url", url)
    assert r.returncode != 0
    assert f"cannot reach NATS at {url}" in r.stderr
    assert "Traceback" not in r.stderr
    assert time.monotonic() - t0 < 20


def test_bad_config_value_stops_start_up_naming_the_field():
    r = statefleet("serve", "mover", env={"SF_HEARTBEAT_S": "soon"})
    assert r.returncode != 0
    assert "heartbeat_s" in r.stderr and "Traceback" not in r.stderr


def _pids_alive(pids: list[int]) -> list[int]:
    alive = []
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        # a zombie is dead for our purposes
        with open(f"/proc/{pid}/stat") as f:
            if f.read().split(")")[-1].split()[0] != "Z":
                alive.append(pid)
    return alive


def _children_of(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-e", "-o", "pid=,ppid="], capture_output=True, text=True).stdout
    kids = [int(p) for p, pp in (line.split() for line in out.splitlines()) if int(pp) == pid]
    return kids + [g for k in kids for g in _children_of(k)]


def test_up_status_ping_and_ctrl_c_leaves_nothing(tmp_path):
    env = {**os.environ, "SF_ADMISSION_HTTP_PORT": str(free_port()), "SF_FENCE_HTTP_PORT": str(free_port()),
           "SF_METRICS_BASE_PORT": "0"}
    up = subprocess.Popen([sys.executable, "-m", "statefleet", "up", "--data-dir", str(tmp_path / "var")],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        url_file = tmp_path / "var" / "nats.url"
        deadline = time.monotonic() + 90  # engine hosts import torch and profile: slow on a loaded 2-core machine
        state = {}
        while time.monotonic() < deadline:
            if url_file.exists():
                r = statefleet("status", "--json", "--nats-url", url_file.read_text().strip())
                if r.returncode == 0:
                    state = json.loads(r.stdout)
                    if len(state["services"]) == 7 and len(state["engines"]) == 2:
                        break
            time.sleep(0.5)
        assert {s["service"] for s in state["services"]} == set(names.SERVICES)
        assert sorted(e["host_id"] for e in state["engines"]) == ["engine-0", "engine-1"]

        import asyncio

        async def ping_all() -> list[Pong]:
            nc = await bus.connect(url_file.read_text().strip(), name="test")
            try:
                subjects = [names.ping_subject(s) for s in names.SERVICES if s != "engine_host"]
                subjects += [names.engine_subject(h, "ping") for h in ("engine-0", "engine-1")]
                return [await bus.request(nc, s, Ping(), Pong) for s in subjects]
            finally:
                await nc.close()

        pongs = asyncio.run(ping_all())
        assert all(p.version and p.uptime_s >= 0 for p in pongs)
        _session_round_trip(env, url_file.read_text().strip(), tmp_path)

        tree = _children_of(up.pid)
        assert len(tree) >= 8  # nats-server, 4 services (placement twice), 2 engine hosts
        up.send_signal(signal.SIGINT)
        out, _ = up.communicate(timeout=40)
        assert up.returncode == 0, out
        assert "statefleet stopped" in out
        assert f"session page     http://127.0.0.1:{env['SF_ADMISSION_HTTP_PORT']}/session" in out
        # the token is printed once, as the dashboard URL's fragment (issue 27: one click signs in; a browser
        # never sends a fragment), and nowhere else
        token = (tmp_path / "var" / "admin_token").read_text().strip()
        assert "admin_token" in out and out.count(token) == 1
        assert f"/dashboard#token={token}  " in out
        time.sleep(0.5)
        assert _pids_alive(tree) == []
    finally:
        if up.poll() is None:
            up.kill()


def _session_round_trip(env: dict, nats_url: str, tmp_path) -> None:
    """A user's session on the supervised system: create, send, watch output, move, watch the owner rise."""
    env = {**env, "SF_NATS_URL": nats_url, "SF_ADMISSION_URL": f"http://127.0.0.1:{env['SF_ADMISSION_HTTP_PORT']}",
           # `up` generated the admin token into its data dir; this client keeps its tokens elsewhere
           "SF_ADMIN_TOKEN": (tmp_path / "var" / "admin_token").read_text().strip()}
    data = ["--data-dir", str(tmp_path / "client")]

    def run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        r = subprocess.run([sys.executable, "-m", "statefleet", "session", *args, *data], capture_output=True,
                           text=True, timeout=timeout, env=env)
        assert r.returncode == 0, r.stdout + r.stderr
        return r

    created = json.loads(run("create", "--backend", "avatar").stdout)  # C1 period: the backend's media per block
    sid, first = created["session_id"], created["host_id"]
    assert first in ("engine-0", "engine-1")
    run("send", sid, "--data", "hello")
    engines = subprocess.run([sys.executable, "-m", "statefleet", "engines", "--json", "--nats-url", nats_url],
                             capture_output=True, text=True, timeout=60, env=env)
    # strict JSON: a metric without samples is null, never NaN
    hosts = json.loads(engines.stdout, parse_constant=lambda c: pytest.fail(f"{c} in engines --json"))
    assert sid in {s["session_id"] for h in hosts for s in h["sessions"]}
    watched = run("watch", sid, "--blocks", "3", "--seconds", "30").stdout
    assert f"owner {first} v1 claimed" in watched and watched.count(" block ") >= 3
    other = "engine-1" if first == "engine-0" else "engine-0"
    assert json.loads(run("move", sid, "--to", other).stdout)["outcome"] == "committed"
    watched = run("watch", sid, "--blocks", "2", "--seconds", "30").stdout
    assert f"owner {other} v2 claimed" in watched and watched.count(" block ") >= 2
    run("delete", sid)

    def status(*flags: str) -> str:
        for _ in range(100):  # the closed state reaches the sessions bucket shortly after delete returns
            r = subprocess.run([sys.executable, "-m", "statefleet", "status", "--nats-url", nats_url, *flags],
                               capture_output=True, text=True, timeout=60, env=env)
            assert r.returncode == 0, r.stdout + r.stderr
            if "closed not shown" in r.stdout or sid not in r.stdout:
                return r.stdout
            time.sleep(0.1)
        raise AssertionError(r.stdout)

    assert sid not in status() and "1 closed not shown" in status()
    assert sid in subprocess.run([sys.executable, "-m", "statefleet", "status", "--all", "--nats-url", nats_url],
                                 capture_output=True, text=True, timeout=60, env=env).stdout


@pytest.mark.slow
def test_killed_supervisor_takes_its_children_with_it(tmp_path):
    env = {**os.environ, "SF_ADMISSION_HTTP_PORT": str(free_port()), "SF_FENCE_HTTP_PORT": str(free_port()),
           "SF_METRICS_BASE_PORT": "0"}
    up = subprocess.Popen([sys.executable, "-m", "statefleet", "up", "--data-dir", str(tmp_path / "var")],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    deadline = time.monotonic() + 30
    tree: list[int] = []
    while time.monotonic() < deadline and len(tree) < 8:
        time.sleep(0.3)
        tree = _children_of(up.pid)
    assert len(tree) >= 8
    up.kill()
    up.wait()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and _pids_alive(tree):
        time.sleep(0.2)
    assert _pids_alive(tree) == []


@pytest.mark.parametrize("bad", ["3:1", "0:2", "two", "1:2:3"])
def test_autoscale_bounds_are_checked_before_anything_starts(bad, capsys):
    from statefleet.cli import build_parser

    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(["up", "--autoscale", bad])
    assert e.value.code == 2 and "MIN" in capsys.readouterr().err
    assert build_parser().parse_args(["up", "--autoscale", "1:3"]).autoscale == (1, 3)
