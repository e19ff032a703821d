"""The embedded setup survives its own bus: under `statefleet up`, a session is fed input while the
nats-server is SIGKILLed. The supervisor restarts it on the same port and data dir, the services
reconnect, and the session carries on: every item ingress acknowledged is stored and applied by the
owner in order, and output keeps flowing after the restart."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time

import aiohttp
import pytest

from libs import bus, names
from libs.natsd import free_port
from libs.schemas.base import decode
from libs.schemas.engine import OutputChunk, SessionInfo, SessionRef
from statefleet import admin_token

ITEMS_BEFORE, ITEMS_TOTAL = 10, 40


def _nats_pid(data_dir) -> int:
    """The embedded server's pid, from the ports file nats-server writes for itself."""
    files = sorted((data_dir / "nats" / "ports").glob("nats-server_*.ports"), key=lambda p: p.stat().st_mtime)
    return int(files[-1].stem.rsplit("_", 1)[1])


async def _wait(fn, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if result := await fn():
                return result
        except Exception:  # the stack is still coming up, or the bus is down: try again
            pass
        await asyncio.sleep(0.25)
    raise AssertionError(f"{what} not reached within {timeout_s}s")


async def _post_until_acked(http, url: str, token: str, text: str, timeout_s: float = 60.0) -> int:
    """What a client does: resend until ingress acknowledges (it dedupes by item id), return the seq."""
    body = {"kind": "text", "data": text, "id": text}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            async with http.post(url, json=body, headers={"Authorization": f"Bearer {token}"}) as r:
                if r.status == 200:
                    return (await r.json())["seq"]
                assert r.status >= 500 or r.status == 429, (r.status, await r.text())
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.1)
    raise AssertionError(f"item {text} never acknowledged")


@pytest.mark.slow
@pytest.mark.timeout(480)  # a loaded machine: the stack's start-up alone may take minutes
def test_statefleet_up_restarts_a_killed_nats_and_the_session_carries_on(tmp_path):
    data_dir = tmp_path / "var"
    admission_port, fence_port = free_port(), free_port()
    env = {**os.environ, "SF_ADMISSION_HTTP_PORT": str(admission_port), "SF_FENCE_HTTP_PORT": str(fence_port)}
    up = subprocess.Popen([sys.executable, "-m", "statefleet", "up", "--data-dir", str(data_dir), "--engines", "1"],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        asyncio.run(_scenario(data_dir, admission_port))
        up.send_signal(signal.SIGINT)
        out, _ = up.communicate(timeout=60)
        assert "nats-server restarted" in out, out
        assert up.returncode == 0, out
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()


async def _scenario(data_dir, admission_port: int) -> None:
    url_file = data_dir / "nats.url"
    await _wait(lambda: asyncio.sleep(0, url_file.exists() and url_file.read_text().strip()), 30, "nats.url")
    nc = await bus.connect(url_file.read_text().strip(), name="test-observer")
    outputs: list[OutputChunk] = []
    try:
        async with aiohttp.ClientSession() as http:
            headers = {"Authorization": f"Bearer {admin_token.read(data_dir)}"}  # `up` generated it
            base = f"http://127.0.0.1:{admission_port}/v1/sessions"

            async def create():
                # C1 without period_ms: admission takes the backend's media per block (400 ms for avatar)
                body = {"contract": {"session_class": "C1", "quality_floor": 1,
                                     "determinism": "T1"}, "backend": "avatar", "seed": 3}
                async with http.post(base, json=body, headers=headers) as r:
                    return await r.json() if r.status in (201, 202) else None

            # Once: a session queued while the engine host still profiles itself is placed when it is up.
            created = await _wait(create, 180, "session created")
            sid, token, url = created["session_id"], created["input_token"], created["input_url"]

            async def placed():
                async with http.get(f"{base}/{sid}", headers=headers) as r:
                    view = await r.json()
                    return view if view.get("state") == "placed" else None

            host_id = (await _wait(placed, 180, "session placed"))["host_id"]

            async def on_output(m) -> None:
                outputs.append(decode(m.data, OutputChunk))

            await nc.subscribe(names.output_subject(sid), cb=on_output)
            acked = [await _post_until_acked(http, url, token, f"i{i}") for i in range(1, ITEMS_BEFORE + 1)]
            await _wait(lambda: asyncio.sleep(0, len(outputs) >= 2), 30, "output before the kill")

            os.kill(_nats_pid(data_dir), signal.SIGKILL)
            killed_at, seen_before = time.monotonic(), len(outputs)
            acked += [await _post_until_acked(http, url, token, f"i{i}")
                      for i in range(ITEMS_BEFORE + 1, ITEMS_TOTAL + 1)]
            assert acked == list(range(1, ITEMS_TOTAL + 1))  # each acknowledged once, in order

            async def applied_all():  # the owner's own word on what its state reflects
                info = await bus.request(nc, names.engine_subject(host_id, "info"),
                                         SessionRef(session_id=sid), SessionInfo)
                return info.input_cursor == ITEMS_TOTAL

            await _wait(applied_all, 60, "every acknowledged item applied")
            await _wait(lambda: asyncio.sleep(0, len(outputs) >= seen_before + 3), 30, "output after the restart")
            assert time.monotonic() - killed_at < 120
    finally:
        await nc.close()
    print(json.dumps({"outputs": len(outputs)}))
