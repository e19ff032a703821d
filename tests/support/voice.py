"""Voice helpers (issue 22: shared from here, not from tests/voice/conftest.py): sessions of the `talking_head`
backend registered as admission registers them, and `AvatarStream` clients on fence's ingress."""

from __future__ import annotations

import msgspec

from libs.contracts import Contract
from libs.fence.ownership import assign
from services.engine_host.backends.talking_head import TalkingHeadBackend
from statefleet.client import AvatarStream
from tests.support import fence
from tests.support.ownership import claimed_by
from tests.support.waiting import STARTING, eventually

BACKEND = TalkingHeadBackend()
# T0: bits reproducible on a replacement; the period is the backend's media per block (real time).
CONTRACT = Contract(session_class="C1", quality_floor=1, determinism="T0",
                    period_ms=BACKEND.media_s_per_block * 1000)


async def register(nc, sid: str, seed: int = 5) -> str:
    """A talking-head session registered as admission registers it (the backend's input kinds and size limit
    with it); its input token."""
    return await fence.register(nc, sid, backend="talking_head", seed=seed, prompt="presenter",
                                contract=msgspec.msgpack.encode(CONTRACT), tier=1,
                                input_kinds=sorted(BACKEND.input_kinds), max_input_bytes=BACKEND.max_input_bytes)


def urls(fence_svc, sid: str) -> tuple[str, str]:
    base = f"127.0.0.1:{fence_svc.http_port}/v1/sessions/{sid}"
    return f"http://{base}/items", f"ws://{base}/output"


async def serving(nc, fence_svc, host: str, sid: str, **kw) -> tuple[AvatarStream, str]:
    """A session on `host`, claimed, with a started stream over it."""
    token = await register(nc, sid)
    stream = AvatarStream(*urls(fence_svc, sid), token, **kw)
    await stream.start()
    await assign(nc, sid, host)
    await eventually(lambda: claimed_by(nc, sid, host), what=f"{host}'s claim", tolerate=STARTING)
    return stream, token
