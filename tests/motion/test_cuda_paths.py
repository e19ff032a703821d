"""The parts of the `cuda` paths that run without a GPU: `bench.gpu`'s section runner."""

from __future__ import annotations

import asyncio
import json

from bench import gpu


async def test_a_section_given_as_a_lambda_around_a_coroutine_is_awaited():
    async def move() -> dict:
        await asyncio.sleep(0)
        return {"verified_gbps": 1.5}

    out: dict = {"sections_s": {}}
    await gpu.run_section(out, "move", lambda: move(), 10)
    await gpu.run_section(out, "plain", lambda: {"gbps": 2.0}, 10)
    await gpu.run_section(out, "hangs", lambda: asyncio.sleep(30), 0.05)
    await gpu.run_section(out, "late", lambda: move(), 0)
    assert out["move"] == {"verified_gbps": 1.5}
    assert out["plain"] == {"gbps": 2.0}
    assert out["hangs"]["error"].startswith("TimeoutError")
    assert "skipped" in out["late"]
    json.dumps(out)  # what bench.gpu writes
