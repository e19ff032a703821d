"""Simulated frontends: create sessions through admission's HTTP API, feed each one input the way a
careful client does (every item carries an id and is resent until ingress acknowledges it, so an
outage costs latency, never an item), and record every output chunk with its arrival time."""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field

import aiohttp

from libs import bus, names
from libs.schemas.engine import OutputChunk

# Statuses a careful client retries (ingress answers them when the bus or the owner is away).
RETRYABLE = {429, 500, 502, 503, 504}


@dataclass(frozen=True)
class Arrival:
    at: float  # monotonic
    block: int
    replayed: bool


@dataclass
class SessionClient:
    sid: str
    token: str
    input_url: str
    host_id: str
    period_s: float
    acked: list[int] = field(default_factory=list)
    ack_times: list[float] = field(default_factory=list)
    arrivals: list[Arrival] = field(default_factory=list)  # one per block (its first chunk), in arrival order
    _blocks_seen: set[tuple[int, bool]] = field(default_factory=set)
    _live_chunks: dict[tuple[int, str, int], int] = field(default_factory=dict)
    # Unmarked chunks published again with other bytes: two owners produced different blocks under one
    # index. (An old owner resumed after the seal may still publish a block it journalled before it:
    # the same bytes the replacement regenerates, so not counted.)
    live_chunks_twice: int = 0
    _task: asyncio.Task | None = None
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    sent: int = 0

    async def on_chunk(self, chunk: OutputChunk) -> None:
        if not chunk.replayed:
            part, digest = (chunk.block, chunk.kind, chunk.part), hash(chunk.data)
            self.live_chunks_twice += self._live_chunks.setdefault(part, digest) != digest
        key = (chunk.block, chunk.replayed)
        if key not in self._blocks_seen:
            self._blocks_seen.add(key)
            self.arrivals.append(Arrival(time.monotonic(), chunk.block, chunk.replayed))

    def live_blocks(self) -> list[Arrival]:
        return [a for a in self.arrivals if not a.replayed]

    def start_input(self, http: aiohttp.ClientSession, every_s: float) -> None:
        self._task = asyncio.create_task(self._feed(http, every_s))

    async def stop_input(self) -> None:
        """Stop after the item in flight is acknowledged (a cancelled post could land unacknowledged)."""
        self._stop.set()
        if self._task is not None:
            await self._task

    async def _feed(self, http: aiohttp.ClientSession, every_s: float) -> None:
        while not self._stop.is_set():
            self.sent += 1
            seq = await post_until_acked(http, self.input_url, self.token, f"{self.sid}-{self.sent}")
            self.acked.append(seq)
            self.ack_times.append(time.monotonic())
            await asyncio.sleep(every_s)


async def post_until_acked(http: aiohttp.ClientSession, url: str, token: str, item_id: str,
                           timeout_s: float = 120.0) -> int:
    """Send one text item and resend it (same id: ingress dedupes) until it is acknowledged."""
    body = {"kind": "text", "data": item_id, "id": item_id}
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            async with http.post(url, json=body, headers={"Authorization": f"Bearer {token}"},
                                 timeout=aiohttp.ClientTimeout(total=10)) as r:
                if r.status == 200:
                    return (await r.json())["seq"]
                if r.status not in RETRYABLE:
                    raise AssertionError(f"item {item_id} refused: {r.status} {await r.text()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"item {item_id} never acknowledged in {timeout_s}s")
        await asyncio.sleep(0.1)


def c1_contract(period_ms: float | None = None, floor: int = 1, determinism: str = "T1") -> dict:
    """A C1 contract; without `period_ms` admission completes it from the backend (one block per its media)."""
    contract = {"session_class": "C1", "quality_floor": floor, "determinism": determinism}
    return contract if period_ms is None else {**contract, "period_ms": period_ms}


async def create(http: aiohttp.ClientSession, admission_url: str, contract: dict, *, backend: str = "avatar",
                 seed: int = 1) -> tuple[int, dict]:
    """POST /v1/sessions once; (status, body). 201 placed, 202 queued, 4xx refused with a reason."""
    async with http.post(f"{admission_url}/v1/sessions", json={"contract": contract, "backend": backend,
                                                               "seed": seed}) as r:
        return r.status, await r.json(content_type=None)


async def open_session(nc, http: aiohttp.ClientSession, admission_url: str, contract: dict, *,
                       seed: int = 1, timeout_s: float = 60.0) -> SessionClient:
    """Create a session (retrying while the stack is busy) and watch its output."""
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(aiohttp.ClientError):
            status, body = await create(http, admission_url, contract, seed=seed)
            if status == 201:
                break
            if status not in RETRYABLE | {202}:
                raise AssertionError(f"create refused: {status} {body}")
        if time.monotonic() > deadline:
            raise AssertionError("no session created")
        await asyncio.sleep(0.5)
    client = SessionClient(sid=body["session_id"], token=body["input_token"], input_url=body["input_url"],
                           host_id=body["host_id"], period_s=body["contract"]["period_ms"] / 1000)
    await bus.subscribe_events(nc, names.output_subject(client.sid), OutputChunk, client.on_chunk)
    return client
