"""A session started from an image, end to end on a real stack: admission's create API takes the
image, fence stores it with the session, the engine host starts the session from it, and after its
host is SIGKILLed the replacement (no checkpoint: it starts from fence's metadata, seed + init
inputs, and regenerates the journaled blocks) produces exactly the blocks an unmoved control does,
so its `static` cross-attention cache was regenerated from the same image."""

from __future__ import annotations

import asyncio
import base64

import aiohttp
import pytest
import torch

from libs import bus, names
from libs.schemas.engine import Advance, OutputChunk, RawImage, SessionInfo, SessionInit
from services.admission.service import AdmissionConfig, AdmissionService
from services.engine_host.backends.base import advance
from services.engine_host.backends.dit import DitWorldBackend
from services.engine_host.output import assemble
from tests.support.waiting import eventually

pytestmark = pytest.mark.slow

SEED = 4
IMAGE = RawImage(width=24, height=16, rgb=bytes((i * 7 + i // 48) % 256 for i in range(24 * 16 * 3)))
CONTRACT = {"session_class": "C3", "quality_floor": 4, "determinism": "T0"}  # tier 4 only: a fixed ladder


def control(init: SessionInit, blocks: int) -> list[torch.Tensor]:
    backend = DitWorldBackend()  # the hosts serve dit's default config
    state = backend.init_state(SEED, init)
    return [advance(backend, state, [], 4).frames for _ in range(blocks)]


async def test_an_image_session_fails_over_to_a_copy_regenerated_from_the_same_image(stack):
    await stack.start(placements=1)
    await stack.engines_up("e0", "e1", SF_CHECKPOINT_EVERY_S="3600")  # no checkpoint: failover starts from meta
    admission = AdmissionService(AdmissionConfig(nats_url=stack.url, http_port=0, log_json=False, heartbeat_s=0.5))
    await stack._service(admission)
    await eventually(lambda: asyncio.sleep(0, len(admission.fleet_view().hosts) == 2))
    image = {"width": IMAGE.width, "height": IMAGE.height, "rgb": base64.b64encode(IMAGE.rgb).decode()}
    async with aiohttp.ClientSession(f"http://127.0.0.1:{admission.http_port}") as http:
        resp = await http.post("/v1/sessions", json={"contract": CONTRACT, "backend": "dit", "seed": SEED,
                                                     "image": image})
        assert resp.status == 201, await resp.text()
        sid = (await resp.json())["session_id"]
    chunks: list[OutputChunk] = []

    async def on_chunk(c: OutputChunk) -> None:
        chunks.append(c)

    await bus.subscribe_events(stack.nc, names.output_subject(sid), OutputChunk, on_chunk)
    first = (await eventually(lambda: stack.claimed_by(sid))).owner.server_id
    await bus.request(stack.nc, names.engine_subject(first, "advance"), Advance(session_id=sid, blocks=3),
                      SessionInfo, timeout_s=60)

    def frames(replayed: bool) -> dict[int, torch.Tensor]:
        """Block number (1-based) → its frames."""
        mine = [c for c in chunks if c.kind == "frames" and c.replayed == replayed]
        return {b: assemble([c for c in mine if c.block == b]) for b in sorted({c.block for c in mine})}

    want = dict(enumerate(control(SessionInit(image=IMAGE), 5), 1))
    await eventually(lambda: asyncio.sleep(0, len(frames(False)) == 3))
    live = frames(False)
    assert all(torch.equal(live[b], want[b]) for b in (1, 2, 3))  # started from the image ...
    assert not torch.equal(live[3], control(SessionInit(), 3)[2])  # ... which the state depends on

    stack.engines[first].kill()
    view = await eventually(lambda: stack.claimed_by(sid, min_version=2), 30)
    second = view.owner.server_id
    assert second != first
    await bus.request(stack.nc, names.engine_subject(second, "advance"), Advance(session_id=sid, blocks=2),
                      SessionInfo, timeout_s=60)
    await eventually(lambda: asyncio.sleep(0, len(frames(False)) == 5 and len(frames(True)) == 3))
    replayed, live = frames(True), frames(False)
    assert all(torch.equal(replayed[b], want[b]) for b in (1, 2, 3))  # regenerated from seed + image
    assert all(torch.equal(live[b], want[b]) for b in (4, 5))  # and going on as the control does
