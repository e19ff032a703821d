"""What a service counted, scraped from its /metrics as Prometheus would (issue 22: shared from here, not from a
test module)."""

from __future__ import annotations

import re

import aiohttp


async def refused(service, metric: str, reason: str) -> float:
    """The summed value of `metric` series with this reason, scraped from the service's /metrics."""
    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://127.0.0.1:{service.metrics_port}/metrics") as resp:
            text = await resp.text()
    pattern = re.compile(rf'^{metric}\{{[^}}]*reason="{reason}"[^}}]*\}} (\S+)$', re.M)
    return sum(float(v) for v in pattern.findall(text))
