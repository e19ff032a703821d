"""Exact-recovery fixtures: fence in this process, engine hosts as real processes (so one can be
SIGKILLed or SIGSTOPped), a steady input producer and a recorder of every output chunk."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import msgspec
import pytest

from libs import bus, names
from libs.contracts import Contract
from libs.fence import block_journal
from libs.fence.ownership import read_owner
from libs.schemas.engine import OutputChunk, SessionInfo, SessionRef
from libs.schemas.fence import BlockEntry, MetaRequest, RegisterReply, RegisterRequest, SessionMeta
from tests.support import waiting

# T0: blocks never coalesced, bits reproducible. 50 ms blocks keep the test short on a busy CPU.
CONTRACT = Contract(session_class="C1", quality_floor=1, determinism="T0", period_ms=50.0)


class HostProcess:
    """`statefleet serve engine_host` as its own process. Every host runs one torch thread: a T0
    session's bits are only reproducible on hosts configured alike."""

    def __init__(self, url: str, host_id: str, tmp_path: Path, **env: str) -> None:
        self.host_id = host_id
        self.log = open(tmp_path / f"{host_id}.log", "w")  # noqa: SIM115 (closed in stop)
        base = {"SF_NATS_URL": url, "SF_HOST_ID": host_id, "SF_INSTANCE_ID": host_id, "SF_PROFILE_BLOCKS": "1",
                "SF_TORCH_THREADS": "1", "SF_CHECKPOINT_DIR": str(tmp_path / "ckpt"), "SF_HEARTBEAT_S": "0.5",
                "SF_CHECKPOINT_EVERY_S": "0.5", "SF_ORPHAN_GRACE_S": "1.0", "SF_LOG_JSON": "false"}
        self.proc = subprocess.Popen([sys.executable, "-m", "statefleet", "serve", "engine_host"],
                                     env={**os.environ, **base, **env}, stdout=self.log, stderr=subprocess.STDOUT)

    async def ready(self, nc, timeout_s: float = 90.0) -> None:
        from libs.schemas.common import Ping, Pong
        for _ in range(int(timeout_s / 0.25)):
            assert self.proc.poll() is None, f"{self.host_id} exited; see its log"
            with contextlib.suppress(Exception):
                await bus.request(nc, names.engine_subject(self.host_id, "ping"), Ping(), Pong, timeout_s=0.5)
                return
            await asyncio.sleep(0.25)
        raise AssertionError(f"{self.host_id} never answered ping")

    def signal(self, sig: int) -> None:
        os.kill(self.proc.pid, sig)

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


@pytest.fixture
def hosts(nats_server, tmp_path):
    started: list[HostProcess] = []

    def start(host_id: str, **env: str) -> HostProcess:
        h = HostProcess(nats_server.url, host_id, tmp_path, **env)
        started.append(h)
        return h

    yield start
    for h in started:
        h.stop()


async def register(nc, sid: str, *, contract: Contract = CONTRACT, seed: int = 7) -> str:
    req = RegisterRequest(session_id=sid, backend="avatar", seed=seed, prompt="narrator",
                          contract=msgspec.msgpack.encode(contract), tier=1)
    return (await bus.request(nc, names.FENCE_REGISTER, req, RegisterReply)).token


async def meta(nc, sid: str) -> SessionMeta:
    return await bus.request(nc, names.FENCE_META, MetaRequest(session_id=sid), SessionMeta)


async def info(nc, host_id: str, sid: str) -> SessionInfo:
    return await bus.request(nc, names.engine_subject(host_id, "info"), SessionRef(session_id=sid), SessionInfo)


# Hosts are separate processes: a condition read from one still starting may fail, which is "not yet".
eventually = functools.partial(waiting.eventually, tolerate=(Exception,))


async def claimed_by(nc, sid: str, host_id: str) -> bool:
    view = (await read_owner(nc.jetstream(), sid)).view
    return view.claim is not None and view.claim == view.owner and view.owner.server_id == host_id


@dataclass
class Producer:
    """Posts one text item every `every_s` seconds; `acked` holds the seq of every item fence stored."""

    url: str
    sid: str
    token: str
    every_s: float = 0.03
    acked: list[int] = field(default_factory=list)
    _task: asyncio.Task | None = None
    _stop: asyncio.Event = field(default_factory=asyncio.Event)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        """Stop after the item in flight is answered (a cancelled post may still be stored, unacked)."""
        assert self._task is not None
        self._stop.set()
        await self._task

    async def _run(self) -> None:
        async with aiohttp.ClientSession(self.url) as http:
            n = 0
            while not self._stop.is_set():
                n += 1
                async with http.post(f"/v1/sessions/{self.sid}/items", json={"kind": "text", "data": f"line {n}"},
                                     headers={"Authorization": f"Bearer {self.token}"}) as resp:
                    assert resp.status == 200, await resp.text()
                    self.acked.append((await resp.json())["seq"])
                await asyncio.sleep(self.every_s)


@dataclass
class OutputLog:
    """Every output chunk of a session, in arrival order."""

    chunks: list[OutputChunk] = field(default_factory=list)

    async def on_chunk(self, chunk: OutputChunk) -> None:
        self.chunks.append(chunk)

    def blocks(self, *, replayed: bool) -> dict[int, list[tuple[str, int, bytes]]]:
        """Block index → its (kind, part, data) pieces, of the chunks marked (or not) replayed."""
        out: dict[int, list[tuple[str, int, bytes]]] = {}
        for c in self.chunks:
            if c.replayed == replayed:
                out.setdefault(c.block, []).append((c.kind, c.part, c.data))
        return {b: sorted(pieces) for b, pieces in out.items()}

    def published_twice(self) -> list[int]:
        """Block indexes published unmarked more than once (a fenced-out copy still publishing)."""
        seen: dict[tuple[int, str, int], int] = {}
        for c in self.chunks:
            if not c.replayed:
                key = (c.block, c.kind, c.part)
                seen[key] = seen.get(key, 0) + 1
        return sorted({k[0] for k, n in seen.items() if n > 1})


async def watch_output(nc, sid: str) -> OutputLog:
    out = OutputLog()
    await bus.subscribe_events(nc, names.output_subject(sid), OutputChunk, out.on_chunk)
    return out


async def journal(nc, sid: str) -> list[BlockEntry]:
    _, tail = await block_journal.read_tail(nc.jetstream(), sid)
    return [e for _, e in await block_journal.read_all(nc.jetstream(), sid, tail)]
