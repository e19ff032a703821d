"""A real stack (NATS, fence, placement, mover, two engine hosts, admission) for the WebRTC tests, one per
module, and sessions created through admission's API as the page creates them. Loopback only: fence offers
127.0.0.1 alone, and the Python viewer likewise."""

from __future__ import annotations

import aiohttp
import pytest
import pytest_asyncio

from tests.browser.conftest import API_KEY, Stack, stack  # noqa: F401 - the module's stack fixture
from tests.support.waiting import eventually

pytest.importorskip("aiortc", reason="the webrtc extra (`make install` installs it)")


async def create_session(s: Stack, backend: str = "avatar", **contract) -> dict:
    """A session as the page creates it; the reply carries its input token and URLs. Created once admission
    hears both engine hosts (on a loaded machine a heartbeat can be late, and a host not heard is not offered)."""
    await eventually(lambda: len(s.admission._live()) == 2, timeout_s=60, what="admission hears both hosts")
    period = {"avatar": 400, "world": 1000 / 15}[backend]
    body = {"backend": backend, "seed": 3, "prompt": "a calm narrator",
            "contract": {"session_class": "C1", "quality_floor": 1, "determinism": "T1", "period_ms": period,
                         **contract}}
    async with aiohttp.ClientSession() as http, http.post(
            f"{s.origin}/v1/sessions", json=body, headers={"Authorization": f"Bearer {API_KEY}"}) as r:
        reply = await r.json()
        assert r.status in (201, 202), reply  # placed, or queued until a host has room: it plays once placed
    return reply


@pytest_asyncio.fixture(loop_scope="module")
async def sessions(stack):  # noqa: F811 - the stack fixture imported above
    """`await sessions()`: a session created as the page does, deleted after the test (the module's two engine
    hosts, on a loaded machine, have room for a few at a time)."""
    made: list[dict] = []

    async def create(**contract) -> dict:
        made.append(await create_session(stack, **contract))
        return made[-1]
    yield create
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {API_KEY}"}) as http:
        for created in made:
            async with http.delete(f"{stack.origin}/v1/sessions/{created['session_id']}") as r:
                assert r.status < 500, await r.text()


async def live_move(s: Stack, session_id: str, to: str, attempts: int = 3) -> dict:
    """A committed live move of the session to host `to` (admin API). On a loaded machine the mover may roll a
    move back (a step past its deadline): that changes nothing, so it is tried again, up to `attempts` times."""
    from tests.browser.conftest import ADMIN_TOKEN

    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as http:
        for _ in range(attempts):
            async with http.post(f"{s.origin}/v1/admin/sessions/{session_id}/move", json={"to": to}) as r:
                receipt = await r.json()
                assert r.status == 200, receipt
            if receipt["outcome"] != "rolled_back":
                break
    assert receipt["outcome"] == "committed", receipt
    return receipt


def rtc_url(created: dict) -> str:
    return created["input_url"].removesuffix("/items") + "/rtc"
