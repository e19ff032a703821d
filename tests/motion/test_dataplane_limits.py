"""The data plane's receiving end under clients it must not wait for: one connection too many, a hello
trickled byte by byte, a sender gone silent mid-transfer, and a layout whose declared shapes do not
match its byte counts. Each is refused with a reason on the wire, counted, and allocates nothing."""

from __future__ import annotations

import asyncio
import re
import time

import pytest
import torch
from prometheus_client import REGISTRY, generate_latest

from libs import telemetry
from libs.errors import Unauthorized
from libs.motion import manifest, wire
from libs.motion.receiver import DataPlane, Limits
from libs.motion.slot import ShadowSlot, SlotState
from libs.schemas.base import encode

TOKEN = "ab" * wire.TOKEN_BYTES


def refused(reason: str) -> float:
    text = generate_latest(REGISTRY).decode()
    found = re.findall(rf'^sf_dataplane_refused_total\{{[^}}]*reason="{reason}"[^}}]*\}} (\S+)$', text, re.M)
    return sum(float(v) for v in found)


@pytest.fixture
async def plane():
    telemetry.setup("test", prometheus=True)  # the counters read below (once per process)
    slots: list[ShadowSlot] = []
    state = torch.arange(4096, dtype=torch.float32)

    def claim(token: str) -> ShadowSlot:
        if token != TOKEN:
            raise Unauthorized("unknown data-plane token")
        slots.append(ShadowSlot("s1", "m1", token, state.nbytes, torch.device("cpu"), lease_s=30))
        return slots[-1]

    planes: list[DataPlane] = []

    async def start(**limits) -> tuple[DataPlane, list[ShadowSlot], dict]:
        p = DataPlane(claim, limits=Limits(**limits))
        await p.start()
        planes.append(p)
        return p, slots, {"state": state}

    yield start
    for p in planes:
        await p.stop()


async def connect(p: DataPlane) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, _, port = p.addr.rpartition(":")
    return await asyncio.open_connection(host, int(port))


async def read_ack(reader: asyncio.StreamReader, timeout_s: float = 5.0) -> tuple[int, str]:
    status, _, n = wire.ACK.unpack(await asyncio.wait_for(reader.readexactly(wire.ACK.size), timeout_s))
    return status, (await reader.readexactly(n)).decode()


async def layout_bytes(tree: dict) -> bytes:
    return encode(await manifest.register("s1", tree))


async def test_one_connection_too_many_is_told_busy(plane):
    p, _, _ = await plane(max_connections=2, hello_timeout_s=5.0)
    before = refused("connections")
    held = [await connect(p) for _ in range(2)]
    await asyncio.sleep(0.1)
    reader, writer = await connect(p)
    status, reason = await read_ack(reader)
    assert status == 1 and "busy" in reason
    assert await reader.read() == b""  # and closed
    writer.close()
    for _, w in held:
        w.close()
    await asyncio.sleep(0.2)
    reader, writer = await connect(p)  # room again: this one is heard (and refused for its token)
    writer.write(wire.MAGIC + bytes(wire.TOKEN_BYTES))
    status, reason = await read_ack(reader)
    writer.close()
    assert status == 1 and "busy" not in reason
    assert refused("connections") == before + 1


async def test_a_trickled_hello_is_cut_off_at_its_deadline(plane):
    p, _, _ = await plane(hello_timeout_s=0.5)
    before = refused("hello_timeout")
    reader, writer = await connect(p)
    start = time.monotonic()

    async def trickle() -> None:
        for byte in wire.MAGIC:  # a byte per 100 ms: no single read ever waits long
            writer.write(bytes([byte]))
            await writer.drain()
            await asyncio.sleep(0.1)

    sending = asyncio.create_task(trickle())
    status, reason = await read_ack(reader)
    sending.cancel()
    writer.close()
    assert status == 1 and "hello" in reason
    assert time.monotonic() - start < 2.0
    assert refused("hello_timeout") == before + 1


async def test_a_sender_silent_mid_transfer_is_dropped_and_its_slot_failed(plane):
    p, slots, tree = await plane(idle_timeout_s=0.5)
    before = refused("idle")
    layout = await layout_bytes(tree)
    reader, writer = await connect(p)
    writer.write(wire.MAGIC + bytes.fromhex(TOKEN) + wire.HELLO.pack(len(layout), 1 << 20, 0, 0, 0) + layout)
    status, reason = await read_ack(reader)  # then nothing more is sent
    writer.close()
    assert status == 1 and "silent" in reason
    assert slots[0].state is SlotState.FAILED
    assert refused("idle") == before + 1


async def test_declared_shapes_are_checked_against_byte_counts_before_allocating(plane):
    """A layout that declares a leaf of 2^40 elements in 16 KiB (or sizes summing to the admitted
    total but not matching their shapes) is refused before the slot allocates anything."""
    p, slots, tree = await plane()
    m = await manifest.register("s1", tree)
    leaf = m.leaves[0]
    lying = m.__class__(**{**{f: getattr(m, f) for f in m.__struct_fields__},
                           "leaves": [leaf.__class__(**{**{f: getattr(leaf, f) for f in leaf.__struct_fields__},
                                                        "shape": [1 << 40]})]})
    layout = encode(lying)
    reader, writer = await connect(p)
    writer.write(wire.MAGIC + bytes.fromhex(TOKEN) + wire.HELLO.pack(len(layout), 1 << 20, 0, 0, 0) + layout)
    status, reason = await read_ack(reader)
    writer.close()
    assert status == 1 and ("shape" in reason or "topology" in reason), reason
    assert slots[0].tensors == [] and slots[0].memory is None and slots[0].state is SlotState.FAILED
