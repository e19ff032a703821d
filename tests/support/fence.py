"""Fence helpers (issue 22: shared from here, not from a folder's conftest.py): fence service instances on a
real nats-server, a small engine that applies items, the item API's calls, and the `fence` (one instance,
"fence-a") and `http` fixtures a folder takes by importing them into its conftest.py or test module."""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass, field

import aiohttp
import pytest

from libs import bus, errors, names
from libs.fence.client import EngineClient, Lease
from libs.schemas.common import InputItem
from libs.schemas.fence import RegisterReply, RegisterRequest
from services.fence.input_reads import read_items
from services.fence.service import FenceConfig, FenceService


async def start_fence(url: str, name: str, **overrides) -> FenceService:
    cfg = FenceConfig(nats_url=url, instance_id=name, http_port=0, heartbeat_s=5.0, **overrides)
    service = FenceService(cfg)
    await service.start()
    return service


@pytest.fixture
async def fence(nats_server):
    service = await start_fence(nats_server.url, "fence-a")
    yield service
    await service.stop()


@pytest.fixture
async def http():
    async with aiohttp.ClientSession() as session:
        yield session


async def register(nc, session_id: str, **kw) -> str:
    """Register a session at fence as admission does (`kw`: the request's other fields); its input token."""
    reply = await bus.request(nc, names.FENCE_REGISTER, RegisterRequest(
        session_id=session_id, backend=kw.pop("backend", "toy"), seed=kw.pop("seed", 7), **kw), RegisterReply)
    return reply.token


async def post(http, service: FenceService, session_id: str, token: str | None, body) -> tuple[int, dict]:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    url = f"http://127.0.0.1:{service.http_port}/v1/sessions/{session_id}/items"
    kwargs = {"data": body} if isinstance(body, (bytes, str)) else {"json": body}
    async with http.post(url, headers=headers, **kwargs) as resp:
        return resp.status, await resp.json(content_type=None)


@dataclass
class ToyEngine:
    """A real consumer of items: its 'state' is the ordered list of item seqs it applied, checkpointed
    into a dict that stands in for the checkpoint store (refs are what the fence records)."""

    client: EngineClient
    checkpoints: dict[str, list[int]]
    checkpoint_every: int = 0
    state: dict[str, list[int]] = field(default_factory=dict)
    leases: dict[str, Lease] = field(default_factory=dict)
    tasks: list[asyncio.Task] = field(default_factory=list)

    async def adopt(self, session_id: str, version: int) -> Lease:
        """Install the session from shared metadata (checkpoint or seed), claim, and start applying."""
        meta = await self.client.meta(session_id)
        restored = list(self.checkpoints.get(meta.checkpoint_ref, [])) if meta.checkpoint_ref else []
        assert len(restored) == meta.checkpoint_cursor
        self.state[session_id] = restored
        lease = await self.client.claim(session_id, version, cursor=meta.checkpoint_cursor)
        self.leases[session_id] = lease
        self.tasks.append(asyncio.create_task(self._apply(lease)))
        return lease

    async def _apply(self, lease: Lease) -> None:
        applied = self.state[lease.session_id]
        async for item in lease:
            assert isinstance(item, InputItem)
            applied.append(item.seq)
            if lease.backlog == 0:  # caught up: say so, as an engine host does (fence bounds what it releases)
                with contextlib.suppress(errors.Unavailable):
                    await lease.report_applied(item.seq)
            if self.checkpoint_every and item.seq % self.checkpoint_every == 0:
                ref = f"{self.client.server_id}:{lease.session_id}:{item.seq}"
                self.checkpoints[ref] = list(applied)
                with contextlib.suppress(errors.Conflict):  # a revoked owner's checkpoint is refused: fine
                    await self.client.checkpoint(lease.session_id, lease.owner.version, ref, item.seq)
        await lease.report_applied(applied[-1] if applied else lease.cursor)

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await self.client.close()


async def engine(nc, server_id: str, checkpoints: dict | None = None, **kw) -> ToyEngine:
    client = EngineClient(nc, nc.jetstream(), server_id)
    await client.start()
    return ToyEngine(client, checkpoints if checkpoints is not None else {}, **kw)


async def stored_items(js, session_id: str) -> list[InputItem]:
    return [i for i, _ in await read_items(js, session_id, 0, 0, max_items=1 << 20, max_bytes=1 << 40)]


async def stored_batches(js, session_id: str) -> int:
    info = await js.stream_info(names.INPUT_STREAM, subjects_filter=names.input_subject(session_id))
    return (info.state.subjects or {}).get(names.input_subject(session_id), 0)


async def burst(http, fence, session_id: str, token: str, frames: list[str]) -> list[dict]:
    """Send every frame over one WebSocket without waiting, then read one answer per frame."""
    url = f"http://127.0.0.1:{fence.http_port}/v1/sessions/{session_id}/ws"
    async with http.ws_connect(url, headers={"Authorization": f"Bearer {token}"}) as ws:
        for f in frames:
            await ws.send_str(f)
        return [await ws.receive_json() for _ in frames]


def frame(text: str) -> str:
    return json.dumps({"kind": "text", "data": text})
