"""One side of the netns move test, run inside a network namespace: `recv BIND TOKEN` or `send ADDR TOKEN`.

Both sides build the same deterministic state, so the receiver knows the
manifest it must verify against without a control plane.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

import torch

from libs.motion import manifest
from libs.motion.receiver import DataPlane
from libs.motion.sender import chunk_grid, send_chunks
from libs.motion.slot import ShadowSlot
from libs.motion.tcp import TcpChannel

LEAF_MIB, LEAVES, CHUNK = 2, 12, 1 << 20


def state() -> dict:
    g = torch.Generator().manual_seed(99)
    n = LEAF_MIB << 20
    return {"kv": [torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g).view(torch.bfloat16)
                   for _ in range(LEAVES)], "cursor": 3}


async def recv(bind: str, token: str) -> None:
    tree = state()
    expected = await manifest.register("s", tree)
    slot = ShadowSlot("s", "netns", token, expected.total_bytes, torch.device("cpu"), lease_s=120)

    def claim(t: str) -> ShadowSlot:
        if t != token:
            raise PermissionError("wrong token")
        return slot

    plane = DataPlane(claim, bind)
    print(json.dumps({"ready": await plane.start()}), flush=True)
    await asyncio.wait_for(slot.done.wait(), 120)
    ok = False
    if slot.state.value == "received":
        ok = (await slot.verify(expected)).manifest.fingerprint == expected.fingerprint
    await plane.stop(grace_s=10)  # the acknowledgement goes out after `done`: let it reach the sender
    print(json.dumps({"ok": ok, "reason": slot.reason}), flush=True)


async def send(addr: str, token: str) -> None:
    tree = state()
    flat = manifest.flatten(tree)
    layout = manifest.build("s", flat, [0] * len(flat.tensors))
    t0 = time.monotonic()
    ch = await TcpChannel.open(addr, token, layout, CHUNK)
    await send_chunks(ch, flat, chunk_grid(flat, CHUNK), bounce=False)
    await ch.finish()
    seconds = time.monotonic() - t0
    await ch.close()
    print(json.dumps({"seconds": seconds, "state_bytes": layout.total_bytes, "wire_bytes": ch.wire_bytes}),
          flush=True)


if __name__ == "__main__":
    mode, addr, token = sys.argv[1:4]
    asyncio.run(recv(addr, token) if mode == "recv" else send(addr, token))
