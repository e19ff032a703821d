"""One side of a same-machine move in its own process, for the kill tests (`python -m tests.motion.shm_peer`).

    receiver STATE_BYTES           serve one slot on a DataPlane; print {"addr", "token"}; run until killed
    sender ADDR TOKEN MIB WAY      send half the chunks, print "half", wait; WAY "push" (a live round:
                                   map the receiver's region, write into it) or "pull" (a frozen round:
                                   the receiver reads this process's memory)
"""

from __future__ import annotations

import asyncio
import json
import sys

import torch

from libs.errors import Unauthorized
from libs.motion import manifest
from libs.motion.receiver import DataPlane
from libs.motion.sender import chunk_grid
from libs.motion.shm import ShmChannel
from libs.motion.slot import ShadowSlot

CHUNK = 1 << 20


def state(mib: int) -> manifest.Flat:
    return manifest.flatten({"kv": torch.arange(mib << 18, dtype=torch.int32), "cursor": 1})


async def receiver(state_bytes: int) -> None:
    token = "ab" * 16

    def claim(t: str) -> ShadowSlot:
        if t != token:
            raise Unauthorized("bad token")
        return ShadowSlot("s", "m", t, state_bytes, torch.device("cpu"), lease_s=600)

    plane = DataPlane(claim)
    print(json.dumps({"addr": await plane.start(), "token": token}), flush=True)
    await asyncio.Event().wait()


async def sender(addr: str, token: str, mib: int, way: str) -> None:
    flat = state(mib)
    layout = manifest.build("s", flat, [0] * len(flat.tensors))
    ch = await ShmChannel.open(addr, token, layout, CHUNK)
    chunks = chunk_grid(flat, CHUNK)
    await ch.put_many([manifest.crc.byte_view(t) for t in flat.tensors], chunks[:len(chunks) // 2],
                      bounce=way == "push")
    print("half", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    role, *args = sys.argv[1:]
    if role == "receiver":
        asyncio.run(receiver(int(args[0])))
    else:
        asyncio.run(sender(args[0], args[1], int(args[2]), args[3]))
