"""Admission and placement running for real on a per-test nats-server; tests play the engine hosts."""

from __future__ import annotations

import aiohttp
import pytest

from tests.support.admission import ADMIN_TOKEN, fleet, placement, start_admission  # noqa: F401 (fixtures)


@pytest.fixture
async def admission(start_admission, placement, fleet):  # noqa: F811 (the fixtures imported above)
    return await start_admission()


@pytest.fixture
async def http(admission):
    # the admin's credential on every request, as `statefleet session` sends it; tests of the
    # credential itself pass their own header
    async with aiohttp.ClientSession(f"http://127.0.0.1:{admission.http_port}",
                                     headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as session:
        yield session
