"""Invariant: engine hosts that share a machine never ask torch for more compute threads together
than the machine has cores (torch's default, every core in every process, oversubscribed a 2-core
machine running two hosts), and each host gets at least one."""

from __future__ import annotations

from libs.config import load
from services.engine_host.service import EngineHostConfig
from services.engine_host.torch_threads import default_count
from statefleet import supervisor


def test_hosts_split_the_cores_and_each_gets_one():
    assert default_count(2, 1) == 2
    assert default_count(2, 2) == 1
    assert default_count(16, 3) == 5
    assert default_count(2, 8) == 1  # more hosts than cores: one each, never zero
    for cores in range(1, 33):
        for hosts in range(1, cores + 1):
            assert hosts * default_count(cores, hosts) <= cores


def test_statefleet_up_tells_every_engine_host_how_many_share_the_machine(tmp_path, monkeypatch):
    monkeypatch.setattr(supervisor.Child, "start", lambda self: None)  # the environment only, no processes
    sup = supervisor.Supervisor(data_dir=str(tmp_path), nats_url="nats://127.0.0.1:1", engines=3, device="cpu")
    sup._start_children()
    engines = [c for c in sup.children if c.service == "engine_host"]
    assert len(engines) == 3
    for c in engines:
        cfg = load(EngineHostConfig, env=c.env)
        assert cfg.hosts_on_machine == 3 and cfg.torch_threads == 0  # 0: the split default
