"""Exact-recovery helpers (issue 22: shared from here, not from tests/recovery/conftest.py): sessions of T0
avatars registered as admission registers them, a steady input producer, a recorder of every output chunk,
and what fence recorded (meta, the block journal)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import aiohttp
import msgspec

from libs import bus, names
from libs.contracts import Contract
from libs.fence import block_journal
from libs.schemas.engine import OutputChunk, SessionInfo, SessionRef
from libs.schemas.fence import BlockEntry, MetaRequest, SessionMeta
from tests.support import fence

# T0: blocks never coalesced, bits reproducible. 50 ms blocks keep the test short on a busy CPU.
CONTRACT = Contract(session_class="C1", quality_floor=1, determinism="T0", period_ms=50.0)
# The same blocks where bits need not be reproducible (a replacement host resumes from fence's checkpoint).
T1_CONTRACT = Contract(session_class="C1", quality_floor=1, determinism="T1", period_ms=50.0)


async def register(nc, sid: str, *, contract: Contract = CONTRACT, seed: int = 7) -> str:
    """An avatar session registered as admission registers it; its input token."""
    return await fence.register(nc, sid, backend="avatar", seed=seed, prompt="narrator",
                                contract=msgspec.msgpack.encode(contract), tier=1)


async def meta(nc, sid: str) -> SessionMeta:
    return await bus.request(nc, names.FENCE_META, MetaRequest(session_id=sid), SessionMeta)


async def info(nc, host_id: str, sid: str) -> SessionInfo:
    return await bus.request(nc, names.engine_subject(host_id, "info"), SessionRef(session_id=sid), SessionInfo)


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
