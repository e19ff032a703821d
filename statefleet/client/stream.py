"""`AvatarStream`: drive a statefleet avatar session from a voice agent.

    stream = await AvatarStream.open(created)           # a CreatedSession (dict or struct)
    await stream.push_audio(tts_pcm, sample_rate=24000)  # resampled to 16 kHz mono, paced
    await stream.end_segment()                           # answered by a `segment_done` event
    await stream.clear()                                 # barge-in: answered by `cleared`
    async for block in stream:                           # AvatarBlock: frames, the same audio, events
        ...

Input goes to fence's ingress as items, each with an id of this stream's own (a resend after a
timeout, a 429 or 503 is recognised by fence and stored once): nothing is lost or repeated when
fence or the session's owner changes, since fence keeps the items and a new owner replays them.
Audio is paced to real time plus a bounded lead (`lead_s`): a TTS burst is sent as fast as the
lead allows, then as it plays, so the session's queue stays short, a `clear` overtakes little,
and the stream never meets ingress's 429 bound. Output comes from the output socket, reassembled
and deduplicated by blocks.py, and the socket is reopened (with backoff) if it drops.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import msgspec
import numpy as np

from libs import errors
from libs.audio_resample import Resampler, as_int16
from libs.schemas.engine import AUDIO_SAMPLE_RATE, OutputChunk
from statefleet.client.blocks import AvatarBlock, BlockAssembler

RETRY_S = (0.05, 0.1, 0.2, 0.5, 1.0)  # backoff of resends and socket reopenings (the last repeats)
_chunk = msgspec.msgpack.Decoder(OutputChunk)


@dataclass(frozen=True, slots=True)
class Stored:
    """One item fence stored: its seq and kind, when its first post was sent and when it was answered
    (the stream's clock): the ingress part of a sample's latency."""

    seq: int
    kind: str
    sent_at: float
    stored_at: float


class AvatarStream:
    def __init__(self, input_url: str, output_ws_url: str, token: str, *, chunk_ms: float = 100.0,
                 lead_s: float = 0.5, http: aiohttp.ClientSession | None = None, max_blocks: int = 256,
                 clock: Callable[[], float] = time.monotonic, request_timeout_s: float = 10.0,
                 give_up_s: float = 60.0) -> None:
        self.input_url, self.output_ws_url = input_url, output_ws_url
        self.chunk_samples = int(AUDIO_SAMPLE_RATE * chunk_ms / 1000)
        self.lead_s = lead_s
        self.clock = clock
        self.request_timeout_s, self.give_up_s = request_timeout_s, give_up_s
        self._headers = {"Authorization": f"Bearer {token}"}
        self._http, self._own_http = http, http is None
        self._ids = (f"{uuid.uuid4().hex[:12]}-{n}" for n in itertools.count(1))
        self._order = asyncio.Lock()  # items are posted one at a time, in call order
        self._generation = 0  # bumped by clear(): audio waiting to be paced out is dropped
        self._cleared = asyncio.Event()  # set (and replaced) by clear(): wakes a paced push
        self._play_end = 0.0  # when the audio sent so far will have played, at real time
        self._resamplers: dict[int, Resampler] = {}
        self._blocks: asyncio.Queue[AvatarBlock] = asyncio.Queue(max_blocks)
        self.assembler = BlockAssembler()
        self.owner: dict[str, Any] | None = None  # the session's owner as the output socket last said
        self.rejected: list[dict] = []  # input_rejected problems (items the backend skipped)
        self.resends = 0
        self.dropped_blocks = 0  # delivered while nobody iterated and the queue was full
        self.last_seq = 0
        self.stored: deque[Stored] = deque(maxlen=64)  # the last items stored, newest last
        self._reader: asyncio.Task | None = None
        self._connected = asyncio.Event()

    @classmethod
    async def open(cls, created: Any, **kw: Any) -> AvatarStream:
        """A stream over a session admission created (its `CreatedSession`, as a dict or struct)."""
        c = created if isinstance(created, dict) else msgspec.structs.asdict(created)
        stream = cls(c["input_url"], c["output_ws_url"], c["input_token"], **kw)
        await stream.start()
        return stream

    async def start(self) -> None:
        if self._http is None:
            self._http = aiohttp.ClientSession()
        self._reader = asyncio.create_task(self._read_output(), name="avatar-stream-output")
        await self._connected.wait()  # the socket is open: no block published from now on is missed

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        if self._own_http and self._http is not None:
            await self._http.close()

    async def __aenter__(self) -> AvatarStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ------------------------------------------------------------ input

    async def push_audio(self, pcm: bytes | np.ndarray, sample_rate: int = AUDIO_SAMPLE_RATE, *,
                         channels: int = 1) -> int:
        """Send int16 PCM (any rate, interleaved channels) as the avatar's speech; returns the samples
        (16 kHz) sent. Returns early, sending no more, if `clear` is called meanwhile."""
        mono = as_int16(pcm, channels)
        resampler = self._resamplers.setdefault(sample_rate, Resampler(sample_rate, AUDIO_SAMPLE_RATE))
        samples = resampler.feed(mono)
        generation, sent = self._generation, 0
        for start in range(0, samples.shape[0], self.chunk_samples):  # one push at a time per stream
            piece = samples[start:start + self.chunk_samples]
            await self._pace(generation)
            async with self._order:
                if generation != self._generation:
                    return sent
                data = {"pcm": base64.b64encode(piece.astype("<i2").tobytes()).decode(),
                        "sample_rate": AUDIO_SAMPLE_RATE}
                await self._post("audio", data)
                self._play_end = max(self._play_end, self.clock()) + piece.shape[0] / AUDIO_SAMPLE_RATE
                sent += piece.shape[0]
        return sent

    async def end_segment(self) -> int:
        """Mark the end of an utterance; its `segment_done` event comes once all its audio has played
        out of the engine. Returns the item's seq (the event's `seq`)."""
        async with self._order:
            return await self._post("segment_end", {})

    async def clear(self, reason: str = "") -> int:
        """Drop every sample not yet played (here, at fence and in the engine); returns the item's seq
        (the `cleared` event's `seq`)."""
        self._generation += 1  # pushes waiting for their turn give up now
        self._cleared.set()
        self._cleared = asyncio.Event()
        self._resamplers.clear()
        async with self._order:
            self._play_end = self.clock()
            return await self._post("clear", {"reason": reason} if reason else {})

    def buffered_s(self) -> float:
        """Audio sent and, at real time, not yet played."""
        return max(0.0, self._play_end - self.clock())

    async def _pace(self, generation: int) -> None:
        """Wait until the audio sent is at most `lead_s` ahead of real time, or a clear comes."""
        ahead = self.buffered_s() - self.lead_s
        if ahead > 0 and generation == self._generation:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._cleared.wait(), ahead)

    async def _post(self, kind: str, data: Any) -> int:
        """Store one item at fence, resending (same id) until it is stored or refused for good."""
        assert self._http is not None, "start() the stream first"
        body = json.dumps({"kind": kind, "data": data, "id": next(self._ids)}).encode()
        sent_at = self.clock()
        deadline = sent_at + self.give_up_s
        for attempt in itertools.count():
            try:
                async with self._http.post(self.input_url, data=body, headers={**self._headers,
                                           "Content-Type": "application/json"},
                                           timeout=aiohttp.ClientTimeout(total=self.request_timeout_s)) as resp:
                    answer = await resp.json(content_type=None)
                    if resp.status == 200:
                        self.last_seq = answer["seq"]
                        self.stored.append(Stored(answer["seq"], kind, sent_at, self.clock()))
                        return answer["seq"]
                    retry = resp.status in (408, 429, 503)
                    error = errors.by_code(answer.get("code", ""))(answer.get("detail", ""), status=resp.status,
                                                                   **{k: answer[k] for k in ("field",) if k in answer})
                    if not retry:
                        raise error
                    wait = float(resp.headers.get("Retry-After", RETRY_S[min(attempt, len(RETRY_S) - 1)]))
            except (TimeoutError, aiohttp.ClientError, ValueError) as e:
                error = errors.Unavailable(f"ingress unanswered: {e!r}")
                wait = RETRY_S[min(attempt, len(RETRY_S) - 1)]
            if self.clock() + wait > deadline:
                raise error
            self.resends += 1
            await asyncio.sleep(wait)
        raise AssertionError("unreachable")

    # ------------------------------------------------------------ output

    def __aiter__(self) -> AsyncIterator[AvatarBlock]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[AvatarBlock]:
        while True:
            yield await self._blocks.get()

    async def _read_output(self) -> None:
        assert self._http is not None
        for attempt in itertools.count():
            try:
                async with self._http.ws_connect(self.output_ws_url, headers=self._headers, heartbeat=10.0) as ws:
                    self._connected.set()
                    attempt = 0
                    async for msg in ws:
                        if msg.type == aiohttp.WSMsgType.BINARY:
                            self._take(_chunk.decode(msg.data))
                        elif msg.type == aiohttp.WSMsgType.TEXT:
                            self.owner = json.loads(msg.data).get("owner", self.owner)
                        else:
                            break
            except (TimeoutError, aiohttp.ClientError, msgspec.DecodeError):
                pass
            await asyncio.sleep(RETRY_S[min(attempt, len(RETRY_S) - 1)])

    def _take(self, chunk: OutputChunk) -> None:
        if chunk.kind == "input_rejected":
            self.rejected.append(json.loads(chunk.data))
            return
        for block in self.assembler.add(chunk):
            if self._blocks.full():  # a live stream: an absent reader loses the oldest, never stalls the socket
                self._blocks.get_nowait()
                self.dropped_blocks += 1
            self._blocks.put_nowait(block)
