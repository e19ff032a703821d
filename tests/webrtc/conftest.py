"""A real stack (NATS, fence, placement, mover, two engine hosts, admission) for the WebRTC tests, one per
module, and sessions created through admission's API as the page creates them. Loopback only: fence offers
127.0.0.1 alone, and the Python viewer likewise."""

from __future__ import annotations

import aiohttp
import pytest

from tests.browser.conftest import API_KEY, Stack, stack  # noqa: F401 - the module's stack fixture

pytest.importorskip("aiortc", reason="the webrtc extra (`make install` installs it)")


async def create_session(s: Stack, backend: str = "avatar", **contract) -> dict:
    """A session as the page creates it; the reply carries its input token and URLs."""
    period = {"avatar": 400, "world": 1000 / 15}[backend]
    body = {"backend": backend, "seed": 3, "prompt": "a calm narrator",
            "contract": {"session_class": "C1", "quality_floor": 1, "determinism": "T1", "period_ms": period,
                         **contract}}
    async with aiohttp.ClientSession() as http, http.post(
            f"{s.origin}/v1/sessions", json=body, headers={"Authorization": f"Bearer {API_KEY}"}) as r:
        reply = await r.json()
        assert r.status in (200, 201), reply
    return reply


def rtc_url(created: dict) -> str:
    return created["input_url"].removesuffix("/items") + "/rtc"
