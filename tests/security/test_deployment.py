"""The deployment files: the compose file is valid Compose (checked against the specification's own
JSON schema, vendored in compose/schema/) and keeps NATS private; the systemd units are hardened and
pass `systemd-analyze verify`; the NATS config a production server includes loads in a real nats-server."""

from __future__ import annotations

import configparser
import json
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from libs import bus_auth, errors
from libs.natsd import NatsServer

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "compose"
UNITS = sorted((COMPOSE / "systemd").glob("*.service"))


def _compose(name: str = "docker-compose.yml") -> dict:
    return yaml.safe_load((COMPOSE / name).read_text())


def _validator() -> jsonschema.Draft7Validator:
    return jsonschema.Draft7Validator(json.loads((COMPOSE / "schema" / "compose-spec.json").read_text()))


@pytest.mark.parametrize("name", ["docker-compose.yml", "docker-compose.monitoring.yml"])
def test_compose_file_is_valid_compose(name):
    errors = sorted(str(e.message) for e in _validator().iter_errors(_compose(name)))
    assert errors == []


def test_the_schema_check_can_fail():
    broken = _compose()
    broken["services"]["fence"]["restart_policy"] = "always"  # not a Compose key
    broken["services"]["nats-1"]["ports"] = "4222:4222"  # must be a list
    assert len(list(_validator().iter_errors(broken))) >= 2


def test_compose_keeps_nats_private_and_services_unprivileged():
    services = _compose()["services"]
    nats = {n: s for n, s in services.items() if n.startswith("nats-")}
    assert nats and all("ports" not in s for s in nats.values())  # neither client nor monitoring port published
    for name, svc in services.items():
        assert svc.get("restart") == "unless-stopped", name
        if name in nats:
            continue
        assert svc["user"] != "root" and svc["read_only"] is True and svc["cap_drop"] == ["ALL"], name
        assert any(f.startswith("./secrets/") for f in svc["env_file"]), name  # its own NATS credentials
        assert "bus" in svc["networks"], name
    published = {n for n, s in services.items() if "ports" in s}
    assert published == {"fence", "admission"}
    assert _compose()["networks"]["bus"]["internal"] is True
    node_conf = (COMPOSE / "nats" / "node.conf").read_text()
    assert "include ./auth.conf" in node_conf and "http: 127.0.0.1:" in node_conf


def test_nats_auth_output_loads_in_a_real_server_and_refuses_anonymous(tmp_path):
    """What `statefleet nats-auth` writes is a config nats-server accepts (parse errors stop it)."""
    subprocess.run([sys.executable, "-m", "statefleet", "nats-auth", "--out", str(tmp_path / "auth"),
                    "--engine-host", "gpu-0"], check=True, capture_output=True, cwd=ROOT)
    assert (tmp_path / "auth" / "engine.gpu-0.env").read_text().startswith("SF_NATS_USER=engine.gpu-0\n")
    assert oct((tmp_path / "auth" / "fence.env").stat().st_mode & 0o777) == "0o600"
    server = NatsServer(store_dir=tmp_path / "nats", config_file=tmp_path / "auth" / "auth.conf").start()
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=2) as s:
            info = s.recv(4096).decode()
        assert '"auth_required":true' in info
    finally:
        server.stop()


def test_permissions_name_no_service_twice_and_give_engines_only_their_own_verbs():
    for user in bus_auth.all_users(["h1"]):
        p = bus_auth.permissions(user)
        assert len(set(p.publish)) == len(p.publish) or user == bus_auth.CLI_USER
    engine = bus_auth.permissions(bus_auth.engine_user("h1"))
    assert "sf.engine.h1.>" in engine.subscribe and not any(s.startswith("sf.engine.*") for s in engine.subscribe)
    with pytest.raises(errors.BadRequest):
        bus_auth.engine_user("h1.>")  # a host id cannot widen its own subjects


@pytest.mark.parametrize("unit", UNITS, ids=[u.name for u in UNITS])
def test_systemd_units_are_hardened(unit):
    cfg = configparser.ConfigParser(strict=False, interpolation=None)
    cfg.optionxform = str
    cfg.read_string(_dedupe_keys(unit.read_text()))
    svc = cfg["Service"]
    assert svc["User"] == "statefleet" and svc["NoNewPrivileges"] == "yes" and svc["ProtectSystem"] == "strict"
    assert svc["Restart"] == "on-failure" and "EnvironmentFile" in svc
    assert "CapabilityBoundingSet" in svc and svc["CapabilityBoundingSet"] == ""


@pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                    reason="systemd-analyze is not installed here (Debian's `systemd` package provides it)")
def test_systemd_units_pass_systemd_analyze_verify(tmp_path):
    root = _unit_root(tmp_path)
    for unit in UNITS:
        instance = unit.name.replace("@.", "@fence." if unit.name.startswith("statefleet@") else "@0.")
        r = subprocess.run(["systemd-analyze", "verify", f"--root={root}", instance], capture_output=True, text=True)
        assert r.returncode == 0 and r.stderr.strip() == "", f"{instance}: {r.stdout}{r.stderr}"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed here")
def test_systemd_verify_catches_a_broken_unit(tmp_path):
    root = _unit_root(tmp_path)
    bad = root / "etc/systemd/system/broken@.service"
    bad.write_text((COMPOSE / "systemd" / "statefleet@.service").read_text().replace("Restart=", "Restrat="))
    r = subprocess.run(["systemd-analyze", "verify", f"--root={root}", "broken@fence.service"],
                       capture_output=True, text=True)
    assert "Restrat" in r.stderr


def _unit_root(tmp_path: Path) -> Path:
    """A root holding the system's own units, ours, and a placeholder for the installed executable
    (verify checks that ExecStart exists; the venv lives at /opt/statefleet only once installed)."""
    root = tmp_path / "root"
    shutil.copytree("/usr/lib/systemd/system", root / "usr/lib/systemd/system", symlinks=True)
    (root / "etc/systemd/system").mkdir(parents=True)
    for unit in UNITS:
        shutil.copy(unit, root / "etc/systemd/system" / unit.name)
    exe = root / "opt/statefleet/.venv/bin/statefleet"
    exe.parent.mkdir(parents=True)
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    return root


def _dedupe_keys(text: str) -> str:
    """systemd allows repeated keys (two EnvironmentFile= lines); configparser does not."""
    seen: dict[tuple[str, str], int] = {}
    out, section = [], ""
    for line in text.splitlines():
        if line.startswith("["):
            section = line
        elif "=" in line and not line.startswith("#"):
            key = line.split("=", 1)[0]
            n = seen[(section, key)] = seen.get((section, key), 0) + 1
            if n > 1:
                line = f"{key}#{n}={line.split('=', 1)[1]}"
        out.append(line)
    return "\n".join(out)
