"""Fault injection for the data plane: every injected fault must fail closed.

A trial moves a small state over the real TCP data plane into a real shadow
slot with one fault injected in flight (or at the edges: a wrong token, a
manifest that does not match the tree, a receiver that never finishes), then
does what the coordinator does: verify, and install only a `VerifiedState`.
It counts `corrupt_installs` (a state installed whose bytes differ from the
source's) and `unsafe` (anything installed at all despite the fault).
Used by the fault tests and by `bench.mover`.
"""

from __future__ import annotations

import asyncio
import random
import secrets
import socket
from dataclasses import dataclass, field

import torch

from libs.errors import StatefleetError, Unauthorized
from libs.motion import manifest, wire
from libs.motion.sender import chunk_grid, leaf_crcs_from_chunks, send_chunks
from libs.motion.slot import ShadowSlot
from libs.motion.tcp import DataPlane, TcpChannel
from libs.schemas.motion import Manifest

KINDS = ("flip_payload", "flip_header", "truncate", "extra_chunk", "reorder", "drop", "wrong_token",
         "reused_token", "manifest_mismatch", "slow_receiver")
CHUNK = 16 << 10
SLOW_DEADLINE_S = 0.05  # the deadline a receiver that never answers overruns


class FaultyChannel(TcpChannel):
    """A TcpChannel that damages its own stream once, at a chosen chunk, after checksumming it."""

    kind: str = ""
    at: int = 0
    rng: random.Random
    held: bytes | None = None
    put_many = None  # every chunk goes through `put`, where the fault is injected

    async def put(self, leaf, offset, data, chunk_crc) -> None:
        n, self.at = self.at, self.at - 1
        if n != 0:
            await super().put(leaf, offset, data, chunk_crc)
            if self.held is not None:
                held, self.held = self.held, None
                await self._send(held)
            return None
        arr = bytearray(data.numpy().tobytes())
        head = bytearray(wire.pack_frame(wire.Frame(wire.DATA, 0, self.seq, leaf, offset, len(arr), len(arr),
                                                    chunk_crc)))
        if self.kind == "flip_payload":
            arr[self.rng.randrange(len(arr))] ^= 1 << self.rng.randrange(8)
        elif self.kind == "flip_header":
            head[self.rng.randrange(len(head))] ^= 1 << self.rng.randrange(8)
        elif self.kind == "reorder":  # this frame overtakes... no: the next frame overtakes this one
            self.held = bytes(head) + bytes(arr)
            self.seq += 1
            self.in_round += 1
            return None
        elif self.kind == "extra_chunk":  # a well-formed frame the sender never meant, injected in flight
            await super().put(leaf, offset, data, chunk_crc)
            junk = torch.randint(0, 256, (len(arr),), dtype=torch.uint8, generator=torch.Generator().manual_seed(
                self.rng.randrange(1 << 30)))
            frame = wire.Frame(wire.DATA, 0, self.seq, leaf, offset, len(arr), len(arr),
                               manifest.crc.crc_bytes(junk))
            self.seq += 1
            await self._send(wire.pack_frame(frame) + junk.numpy().tobytes())
            return None
        elif self.kind == "truncate":
            await self._send(bytes(head) + bytes(arr[: self.rng.randrange(len(arr))]))
            self.sock.shutdown(socket.SHUT_WR)
            return None
        elif self.kind == "drop":
            self.sock.close()
            raise ConnectionResetError("injected: connection dropped")
        self.seq += 1
        self.in_round += 1
        await self._send(bytes(head) + bytes(arr))



@dataclass
class Campaign:
    faults_injected: int = 0
    failed_closed: int = 0
    corrupt_installs: int = 0
    unsafe: int = 0  # installed anything despite a fault
    source_changed: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)


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

    def arm(self, session_id: str, nbytes: int) -> ShadowSlot:
        token = secrets.token_hex(16)
        slot = self.slots[token] = ShadowSlot(session_id, token, token, nbytes, torch.device("cpu"), lease_s=30)
        return slot


async def _silent_server() -> tuple[socket.socket, str]:
    """A receiver slower than any deadline: it accepts and never answers."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(8)
    s.setblocking(False)
    return s, f"127.0.0.1:{s.getsockname()[1]}"


async def trial(kind: str, rng: random.Random, recv: _Receiver, silent_addr: str, c: Campaign) -> None:
    tree = _tree(rng)
    flat = manifest.flatten(tree)
    before = [t.clone() for t in flat.tensors]
    layout = manifest.build("s", flat, [0] * len(flat.tensors))
    slot = recv.arm("s", layout.total_bytes)
    chunks = chunk_grid(flat, CHUNK)
    token = slot.token if kind != "wrong_token" else secrets.token_hex(16)
    addr = silent_addr if kind == "slow_receiver" else recv.plane.addr
    installed = None
    try:
        async with asyncio.timeout(SLOW_DEADLINE_S if kind == "slow_receiver" else 10):
            if kind == "reused_token":  # a clean transfer spends the token; a stray connection replays it
                crcs = await _send(TcpChannel, addr, token, layout, flat, chunks, rng, kind)
                m = manifest.build("s", flat, leaf_crcs_from_chunks(flat, chunks, crcs))
                flipped = [t.clone() for t in flat.tensors]
                flipped[0].view(-1)[0] += 1
                stray = manifest.Flat(flat.paths, flipped, flat.control)
                try:
                    await _send(TcpChannel, addr, token, layout, stray, chunks, rng, kind)
                finally:
                    await slot.verify(m)  # the first transfer's bytes are intact
                    slot.fail("stray replay ended the trial")
            crcs = await _send(FaultyChannel, addr, token, layout, flat, chunks, rng, kind)
        m = manifest.build("s", flat, leaf_crcs_from_chunks(flat, chunks, crcs))
        if kind == "manifest_mismatch":
            m = _mismatched(m, rng)
        installed = await slot.verify(m)
    except (StatefleetError, OSError, TimeoutError) as e:
        sender_saw = getattr(e, "detail", None) or str(e) or type(e).__name__
        receiver_saw = slot.reason  # the receiver's own reason, when it refused first
        if slot.state.value != "verified":
            slot.fail(sender_saw)
        c.reasons[kind] = receiver_saw or sender_saw
    c.faults_injected += 1
    c.by_kind[kind] = c.by_kind.get(kind, 0) + 1
    if installed is None:
        c.failed_closed += 1
    else:
        c.unsafe += 1
        staged = [manifest.crc.byte_view(t) for t in slot.tensors]
        if any(not torch.equal(a, manifest.crc.byte_view(b)) for a, b in zip(staged, before, strict=True)):
            c.corrupt_installs += 1
    if any(not torch.equal(manifest.crc.byte_view(a), manifest.crc.byte_view(b))
           for a, b in zip(flat.tensors, before, strict=True)):
        c.source_changed += 1
    recv.slots.pop(slot.token, None)


async def _send(cls, addr, token, layout, flat, chunks, rng, kind) -> list[int]:
    ch = await cls.open(addr, token, layout, CHUNK)
    if isinstance(ch, FaultyChannel):
        ch.kind, ch.rng = kind, rng
        last = len(chunks) - 1 if kind == "reorder" else len(chunks)  # a frame must follow the one held back
        ch.at = rng.randrange(last) if kind not in ("wrong_token", "manifest_mismatch", "slow_receiver",
                                                           "reused_token") else -1
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


async def run_campaign(n: int, seed: int = 0) -> Campaign:
    rng = random.Random(seed)
    c = Campaign()
    recv = _Receiver()
    await recv.plane.start()
    silent, silent_addr = await _silent_server()
    try:
        for i in range(n):
            await trial(KINDS[i % len(KINDS)], rng, recv, silent_addr, c)
    finally:
        silent.close()
        await recv.plane.stop()
    return c
