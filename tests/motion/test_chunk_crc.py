"""A chunk whose bytes differ from the sender's CRC leaves nothing received on the receiver (issue 22).

The invariant: a shadow slot reaches RECEIVED only if every staged chunk matched the CRC the sender
sent with it; a damaged chunk fails the slot at once and drops its staged bytes, so there is nothing
a verify could bind or a commit install. The fault campaign (`test_faults.py`) caught a receiver that
skips the per-chunk compare only by its reason string (the later whole-copy verify still refused the
copy); this test asserts the outcome on the slot itself, and was seen failing against that violation
(the compare in `checked_copy.check_staged` / `copy_and_check` skipped: the slot ended RECEIVED with
the damaged bytes staged).
"""

from __future__ import annotations

import random
import secrets

import pytest
import torch

from bench.mover_faults import CHUNK, CODECS, FaultyChannel
from libs.errors import Conflict, StatefleetError, Unauthorized
from libs.motion import checksum, manifest
from libs.motion.receiver import DataPlane
from libs.motion.sender import chunk_grid, send_chunks
from libs.motion.slot import ShadowSlot, SlotState
from libs.motion.tcp import TcpChannel


@pytest.mark.parametrize("codec", CODECS)
async def test_a_chunk_that_fails_its_crc_leaves_nothing_received(codec):
    g = torch.Generator().manual_seed(11)
    flat = manifest.flatten({"a": torch.randn(64, 256, generator=g), "b": torch.randint(0, 9, (5000,), generator=g)})
    layout = manifest.build("s", flat, [0] * len(flat.tensors))
    token = secrets.token_hex(16)
    slot = ShadowSlot("s", "m1", token, layout.total_bytes, torch.device("cpu"), lease_s=30)

    def claim(t: str) -> ShadowSlot:
        if t != token or slot.state is not SlotState.ARMED:
            raise Unauthorized("unknown or used token")
        return slot

    plane = DataPlane(claim)
    await plane.start()
    try:
        chunks = chunk_grid(flat, CHUNK)
        inner = await TcpChannel.open(plane.addr, token, layout, CHUNK, codec=codec, byte_planes=codec == "zstd")
        channel = FaultyChannel(inner, "flip_payload", at=1, rng=random.Random(3))  # one bit of chunk 1 flipped
        try:
            with pytest.raises((StatefleetError, OSError)):
                await send_chunks(channel, flat, chunks, bounce=False)
                await channel.finish()
        finally:
            await channel.close()
        await slot.done.wait()
        assert slot.state is SlotState.FAILED  # never RECEIVED: no staged copy claims to be the sender's
        assert slot.tensors == [] and slot.flats == []  # the staged bytes are dropped
        genuine = manifest.build("s", flat, await manifest.leaf_crcs(flat.tensors, checksum.CRC32C))
        with pytest.raises(Conflict):
            await slot.verify(genuine)  # nothing to bind, so nothing a commit could install
        assert slot.verified is None
    finally:
        await plane.stop()
