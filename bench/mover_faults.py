"""Fault injection for the data plane: every injected fault must fail closed.

A trial moves a small state over the real TCP data plane into a real shadow
slot with one fault injected in flight (or at the edges: a wrong token, a
manifest that does not match the tree, a receiver that never finishes), then
does what the coordinator does: verify, and install only a `VerifiedState`.
Trials rotate through the wire codecs (uncompressed, zstd with byte planes,
lz4), so a damaged chunk reaches each receive path: straight into the staged
tensor, and decoded on a worker; where a GPU is present they also alternate
host and device slots (a device slot stages every chunk through host).
It counts `corrupt_installs` (a state installed whose bytes differ from the
source's) and `unsafe` (anything installed at all despite the fault).
Used by `bench.mover` and by the fault tests.
"""

from __future__ import annotations

import asyncio
import random
import secrets
import socket
from dataclasses import dataclass, field

import numpy as np
import torch

from libs.errors import StatefleetError, Unauthorized
from libs.motion import crc, manifest
from libs.motion.receiver import DataPlane
from libs.motion.sender import chunk_grid, leaf_crcs_from_chunks, send_chunks
from libs.motion.slot import ShadowSlot
from libs.motion.tcp import TcpChannel
from libs.motion.transport import Channel
from libs.schemas.motion import Manifest

KINDS = ("flip_payload", "flip_header", "truncate", "extra_chunk", "reorder", "drop", "wrong_token",
         "reused_token", "manifest_mismatch", "slow_receiver")
CODECS = ("none", "zstd", "lz4")
DEVICES = ("cpu", "cuda") if torch.cuda.is_available() else ("cpu",)
CHUNK = 16 << 10
SLOW_DEADLINE_S = 0.05  # the deadline a receiver that never answers overruns


class FaultyChannel(Channel):
    """A TCP channel that damages its own stream once, at chunk `at`, after checksumming it.

    Every chunk goes through `put` (the base `put_many`), so the fault lands on the chunk chosen;
    healthy chunks are sent by the wrapped `TcpChannel` exactly as it sends them."""

    def __init__(self, inner: TcpChannel, kind: str, at: int, rng: random.Random) -> None:
        self.inner, self.kind, self.at, self.rng = inner, kind, at, rng
        self.held: bytes | None = None

    @property
    def wire_bytes(self) -> int:
        return self.inner.wire_bytes

    async def put(self, leaf: int, offset: int, data: torch.Tensor, chunk_crc: int) -> None:
        n, self.at = self.at, self.at - 1
        stream = self.inner.stream
        if n != 0:
            await self.inner.put(leaf, offset, data, chunk_crc)
            if self.held is not None:
                held, self.held = self.held, None
                await stream.send(held)
            return
        if self.kind == "extra_chunk":  # a well-formed frame the sender never meant, injected in flight
            await self.inner.put(leaf, offset, data, chunk_crc)
            junk = torch.randint(0, 256, (data.numel(),), dtype=torch.uint8,
                                 generator=torch.Generator().manual_seed(self.rng.randrange(1 << 30)))
            payload = bytes(self.inner.encode(leaf, junk.numpy()))
            frame = stream.data_frame(self.inner.codec_id, leaf, offset, junk.numel(), len(payload),
                                      crc.crc_bytes(junk))
            stream.in_round -= 1  # the sender's own round count leaves the injected frame out
            await stream.send(frame, payload)
            return
        raw = bytearray(data.cpu().numpy().tobytes())
        if self.kind == "flip_payload":  # flipped before encoding: the payload decodes, only the CRC can tell
            raw[self.rng.randrange(len(raw))] ^= 1 << self.rng.randrange(8)
        payload = bytes(self.inner.encode(leaf, np.frombuffer(raw, dtype=np.uint8)))
        head = bytearray(stream.data_frame(self.inner.codec_id, leaf, offset, len(raw), len(payload), chunk_crc))
        if self.kind == "flip_header":
            head[self.rng.randrange(len(head))] ^= 1 << self.rng.randrange(8)
        elif self.kind == "reorder":  # held back: the next chunk's frame overtakes this one
            self.held = bytes(head) + payload
            return
        elif self.kind == "truncate":
            await stream.send(bytes(head) + payload[: self.rng.randrange(len(payload))])
            stream.sock.shutdown(socket.SHUT_WR)
            return
        elif self.kind == "drop":
            stream.sock.close()
            raise ConnectionResetError("injected: connection dropped")
        await stream.send(bytes(head), payload)

    async def end_round(self) -> None:
        await self.inner.end_round()

    async def finish(self) -> int:
        return await self.inner.finish()

    async def close(self) -> None:
        await self.inner.close()


@dataclass
class Campaign:
    faults_injected: int = 0
    failed_closed: int = 0
    corrupt_installs: int = 0
    unsafe: int = 0  # installed anything despite a fault
    source_changed: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)
    by_route: dict[str, int] = field(default_factory=dict)  # "kind/codec/device" -> trials
    reasons: dict[str, str] = field(default_factory=dict)  # by kind, and by "kind/codec/device"


@dataclass(frozen=True)
class Route:
    """The receive path a trial exercises: the wire codec and where the slot lives."""

    codec: str
    device: str

    @property
    def byte_planes(self) -> bool:
        return self.codec == "zstd"


def _tree(rng: random.Random) -> dict:
    g = torch.Generator().manual_seed(rng.randrange(1 << 30))
    return {"a": torch.randn(48, 256, generator=g).to(torch.bfloat16),
            "b": [torch.randn(33, 100, generator=g), torch.randint(0, 9, (1000,), generator=g)],
            "c": {"cursor": rng.randrange(100), "name": "s"}}


class _Receiver:
    """One data plane whose tokens map to fresh slots, like an endpoint after `admit`."""

    def __init__(self) -> None:
        self.slots: dict[str, ShadowSlot] = {}
        self.plane = DataPlane(self.claim)

    def claim(self, token: str) -> ShadowSlot:
        slot = self.slots.get(token)
        if slot is None or slot.state.value != "armed":
            raise Unauthorized("unknown, used or expired data-plane token")
        return slot

    def arm(self, session_id: str, nbytes: int, device: str) -> ShadowSlot:
        token = secrets.token_hex(16)
        slot = self.slots[token] = ShadowSlot(session_id, token, token, nbytes, torch.device(device), lease_s=30)
        return slot


async def _silent_server() -> tuple[socket.socket, str]:
    """A receiver slower than any deadline: it accepts and never answers."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(8)
    s.setblocking(False)
    return s, f"127.0.0.1:{s.getsockname()[1]}"


def _same_bytes(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(crc.byte_view(x).cpu(), crc.byte_view(y).cpu()) for x, y in zip(a, b, strict=True))


async def trial(kind: str, route: Route, rng: random.Random, recv: _Receiver, silent_addr: str, c: Campaign) -> None:
    tree = _tree(rng)
    flat = manifest.flatten(tree)
    before = [t.clone() for t in flat.tensors]
    layout = manifest.build("s", flat, [0] * len(flat.tensors))
    slot = recv.arm("s", layout.total_bytes, route.device)
    chunks = chunk_grid(flat, CHUNK)
    token = slot.token if kind != "wrong_token" else secrets.token_hex(16)
    addr = silent_addr if kind == "slow_receiver" else recv.plane.addr
    installed = None
    try:
        async with asyncio.timeout(SLOW_DEADLINE_S if kind == "slow_receiver" else 10):
            if kind == "reused_token":  # a clean transfer spends the token; a stray connection replays it
                crcs = await _send(addr, token, layout, flat, chunks, route)
                m = manifest.build("s", flat, leaf_crcs_from_chunks(flat, chunks, crcs))
                flipped = [t.clone() for t in flat.tensors]
                flipped[0].view(-1)[0] += 1
                stray = manifest.Flat(flat.paths, flipped, flat.control)
                try:
                    await _send(addr, token, layout, stray, chunks, route)
                finally:
                    await slot.verify(m)  # the first transfer's bytes are intact
                    slot.fail("stray replay ended the trial")
            crcs = await _send(addr, token, layout, flat, chunks, route, fault=(kind, rng))
        m = manifest.build("s", flat, leaf_crcs_from_chunks(flat, chunks, crcs))
        if kind == "manifest_mismatch":
            m = _mismatched(m, rng)
        installed = await slot.verify(m)
    except (StatefleetError, OSError, TimeoutError) as e:
        sender_saw = getattr(e, "detail", None) or str(e) or type(e).__name__
        receiver_saw = slot.reason  # the receiver's own reason, when it refused first
        if slot.state.value != "verified":
            slot.fail(sender_saw)
        c.reasons[kind] = c.reasons[f"{kind}/{route.codec}/{route.device}"] = receiver_saw or sender_saw
    c.faults_injected += 1
    c.by_kind[kind] = c.by_kind.get(kind, 0) + 1
    key = f"{kind}/{route.codec}/{route.device}"
    c.by_route[key] = c.by_route.get(key, 0) + 1
    if installed is None:
        c.failed_closed += 1
    else:
        c.unsafe += 1
        if not _same_bytes(slot.tensors, before):
            c.corrupt_installs += 1
    if not _same_bytes(flat.tensors, before):
        c.source_changed += 1
    recv.slots.pop(slot.token, None)


async def _send(addr: str, token: str, layout: Manifest, flat: manifest.Flat, chunks: list, route: Route,
                fault: tuple[str, random.Random] | None = None) -> list[int]:
    ch: Channel = await TcpChannel.open(addr, token, layout, CHUNK, codec=route.codec, byte_planes=route.byte_planes)
    if fault is not None:
        kind, rng = fault
        last = len(chunks) - 1 if kind == "reorder" else len(chunks)  # a frame must follow the one held back
        at = rng.randrange(last) if kind not in ("wrong_token", "manifest_mismatch", "slow_receiver",
                                                 "reused_token") else -1
        ch = FaultyChannel(ch, kind, at, rng)
    try:
        crcs = await send_chunks(ch, flat, chunks, bounce=False)
        await ch.finish()
        return crcs
    finally:
        await ch.close()


def _mismatched(m: Manifest, rng: random.Random) -> Manifest:
    """A self-consistent manifest for a different tree: one leaf's CRC differs."""
    leaves = list(m.leaves)
    i = rng.randrange(len(leaves))
    leaves[i] = leaves[i].__class__(path=leaves[i].path, dtype=leaves[i].dtype, shape=leaves[i].shape,
                                    nbytes=leaves[i].nbytes, crc32c=leaves[i].crc32c ^ 1)
    crcs = [x.crc32c for x in leaves]
    return Manifest(session_id=m.session_id, leaves=leaves, control=m.control, topology=m.topology,
                    fingerprint=manifest.whole_fingerprint(m.topology, m.control, crcs), total_bytes=m.total_bytes)


def route_of(i: int) -> Route:
    """Trial `i`'s receive path: each kind cycles through the codecs, then through the devices."""
    variant = i // len(KINDS)
    return Route(CODECS[variant % len(CODECS)], DEVICES[(variant // len(CODECS)) % len(DEVICES)])


async def run_campaign(n: int, seed: int = 0) -> Campaign:
    rng = random.Random(seed)
    c = Campaign()
    recv = _Receiver()
    await recv.plane.start()
    silent, silent_addr = await _silent_server()
    try:
        for i in range(n):
            await trial(KINDS[i % len(KINDS)], route_of(i), rng, recv, silent_addr, c)
    finally:
        silent.close()
        await recv.plane.stop()
    return c
