"""On a 3-node JetStream cluster (replicas = 3, per-service users), the meta leader, then the input
stream's leader, then the ownership log's leader are SIGKILLed mid-traffic, each node restarted once
the stack has recovered from its loss."""

from __future__ import annotations

import asyncio
import json
import shutil
import time
import urllib.request
from pathlib import Path

import pytest

from libs import bus_auth, names
from libs.natsd import NatsServer, free_port
from tests.support.chaos import LOGS, assert_clean, record

pytestmark = pytest.mark.chaos


class Node(NatsServer):
    monitor_port: int = 0

    def jsz(self) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.monitor_port}/jsz", timeout=2) as r:
            return json.load(r)


def start_nodes(base: Path, host_ids: list[str]) -> tuple[list[Node], str]:
    """Three routed nodes with the per-service users and a monitoring port each; the CLI user's URL list."""
    creds = bus_auth.write_auth(base / "auth", host_ids)
    routes = [f"nats://127.0.0.1:{free_port()}" for _ in range(3)]
    nodes = []
    for i, route in enumerate(routes):
        node = Node(store_dir=base / f"n{i}", cluster_port=int(route.rsplit(":", 1)[1]), routes=routes,
                    server_name=f"n{i}", config_file=base / "auth" / f"n{i}.conf")
        node.monitor_port = free_port()
        node.config_file.write_text(f'include "auth.conf"\nhttp_port: {node.monitor_port}\n')
        nodes.append(node.start())
    return nodes, bus_auth.url_with(",".join(n.url for n in nodes), creds[bus_auth.CLI_USER])


async def meta_leader(nodes: list[Node], timeout_s: float = 60.0) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for n in nodes:
            if n.proc is None or n.proc.poll() is not None:
                continue
            try:
                leader = (await asyncio.to_thread(n.jsz)).get("meta_cluster", {}).get("leader")
            except OSError:
                continue
            if leader:
                return leader
        await asyncio.sleep(0.2)
    raise AssertionError("no JetStream meta leader")


async def stream_leader(js, stream: str, timeout_s: float = 60.0) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            info = await js.stream_info(stream)
            if info.cluster is not None and info.cluster.leader:
                return info.cluster.leader
        except Exception:  # no leader yet, or the client is reconnecting
            pass
        await asyncio.sleep(0.2)
    raise AssertionError(f"{stream} has no leader")


@pytest.fixture
def nodes(tmp_path, request):  # requested before `drill`, so the cluster outlives the stack
    started: list[Node] = []
    yield started
    for n in started:
        n.stop()
        # Kept beside the services' logs for diagnosis (tmp dirs rotate away).
        if n.log_path is not None and n.log_path.exists():
            kept = LOGS / request.node.name
            kept.mkdir(parents=True, exist_ok=True)
            shutil.copy(n.log_path, kept / f"nats-{n.server_name}.log")


async def test_cluster_leaders_killed_mid_traffic(nodes, drill, chaos_results, tmp_path):
    started, url = start_nodes(tmp_path / "cluster", ["engine-0", "engine-1"])
    nodes.extend(started)
    await meta_leader(nodes)  # streams are created by the services at start: they need a meta leader
    d = await drill(engines=2, nats_url=url, SF_NATS_REPLICAS="3")
    await d.open(3)
    by_name = {n.server_name: n for n in nodes}
    js = d.nc.jetstream()
    for what, leader in (("JetStream meta leader", lambda: meta_leader(nodes)),
                         (f"{names.INPUT_STREAM} stream leader", lambda: stream_leader(js, names.INPUT_STREAM)),
                         (f"{names.SESSION_STREAM} stream leader", lambda: stream_leader(js, names.SESSION_STREAM))):
        victim = by_name[await leader()]
        victim.kill()
        at = d.fault(f"SIGKILL the {what} ({victim.server_name}) of a 3-node cluster")
        await d.recovered(at)
        victim.restart()
        await meta_leader([victim])  # it rejoined and knows the cluster before the next fault
        await d.serving()
    row = record(chaos_results, "nats_cluster_leaders_killed", d, await d.finish())
    assert_clean(row)
