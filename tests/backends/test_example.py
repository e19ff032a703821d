"""An out-of-tree backend package (examples/tone_backend), pip-installed into a directory of its own,
is found through its entry point and served end to end by an engine host over NATS."""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from libs import bus, names
from libs.schemas.common import InputItem
from libs.schemas.engine import Advance, OpenSession, OutputChunk, SessionInfo
from services.engine_host.backends.registry import Registry
from services.engine_host.output import assemble
from services.engine_host.service import EngineHostConfig, EngineHostService
from statefleet.backends import host_backends

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tone_backend"


@pytest.fixture(scope="module")
def tone_site(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("tone")
    src, site = work / "src", work / "site"
    shutil.copytree(EXAMPLE, src)  # builds in the copy, never in the repository
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--target", str(site), str(src)], check=True, timeout=240)
    return site


def pcm(n: int, amp: int = 8000) -> bytes:
    t = torch.arange(n, dtype=torch.float64)
    return (torch.sin(t * 0.05) * amp).round().to(torch.int16).numpy().tobytes()


async def test_an_installed_package_backend_is_served_end_to_end(nats_server, tone_site, monkeypatch):
    assert "tone" not in Registry().names()
    monkeypatch.syspath_prepend(str(tone_site))
    assert Registry().sources["tone"] == "statefleet_tone:ToneBackend"
    host = EngineHostService(EngineHostConfig(nats_url=nats_server.url, log_json=False, heartbeat_s=0.5,
                                              host_id="t1", profile_blocks=1, torch_threads=1))
    await host.start()
    nc = await bus.connect(nats_server.url, name="test")
    try:
        got: list[OutputChunk] = []

        async def take(c: OutputChunk) -> None:
            got.append(c)

        await bus.subscribe_events(nc, names.output_subject("tn"), OutputChunk, take)
        info = await bus.request(nc, names.engine_subject("t1", "open"),
                                 OpenSession(session_id="tn", backend="tone", seed=3, audio=pcm(1600)), SessionInfo)
        assert info.state == "running" and info.tier == 2
        data = json.dumps(base64.b64encode(pcm(3200)).decode()).encode()
        await host.runtime.apply_input(InputItem(session_id="tn", seq=1, kind="audio", data=data))
        info = await bus.request(nc, names.engine_subject("t1", "advance"), Advance(session_id="tn", blocks=2),
                                 SessionInfo, timeout_s=30)
        assert info.blocks_done == 2 and info.consumed_seq == 1
        for _ in range(100):
            if {(c.block, c.kind) for c in got} >= {(1, "frames"), (1, "audio"), (2, "frames"), (2, "audio")}:
                break
            await asyncio.sleep(0.05)
        frames = assemble([c for c in got if c.block == 1 and c.kind == "frames"])
        audio = assemble([c for c in got if c.block == 1 and c.kind == "audio"])
        assert frames.shape == (4, 3, 16, 16) and audio.shape == (3200,) and audio.abs().max() > 0
        listed = {e.host_id: e for e in await host_backends(nats_server.url)}
        tone = next(b for b in listed["t1"].backends if b.name == "tone")
        assert tone.source == "statefleet_tone:ToneBackend" and tone.input_kinds == ["audio"]
        assert tone.static_bytes == 8 and tone.moved_bytes == 32
    finally:
        await nc.close()
        await host.stop()
