"""What the engine hosts' heartbeats said while a bench ran: the load the capacity model priced beside the
load the hosts' stages measured, device-wide, so a run whose failovers were refused `busy` shows whether
the device was full or its prices overstated it (docs/reliability.md, "Exact under load").

Sampled every `every_s` from `sf_engines` (the entries placement reads): per sample, every host's
`busy_fraction` (promised: sessions at their floors, at the learned prices), `measured_fraction` (its
stages' own running time over wall time) and its lone floor-row block price for `backend`. Every host of
the bench shares one CPU, so the device's figures are the hosts' sums (`contracts.pooled`)."""

from __future__ import annotations

import asyncio
import contextlib
import time

from bench.common import percentile
from libs import bus, errors, names
from libs.schemas.base import decode
from libs.schemas.common import EngineEntry


class HeartbeatTrace:
    def __init__(self, js: bus.JetStream, hosts: list[str], backend: str, every_s: float = 1.0) -> None:
        self.js, self.hosts, self.backend, self.every_s = js, hosts, backend, every_s
        self.samples: list[dict] = []
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        kv = await self.js.key_value(names.ENGINES_BUCKET)
        while True:
            sample: dict = {"at": time.time(), "hosts": {}}
            for h in self.hosts:
                with contextlib.suppress(errors.StatefleetError):
                    if (entry := await bus.kv_read(kv, h)) is not None:
                        e = decode(entry.value or b"", EngineEntry)
                        rows = [r for r in e.profile if r.backend == self.backend]
                        sample["hosts"][h] = {
                            "sessions": e.sessions, "busy_fraction": round(e.busy_fraction, 4),
                            "measured_fraction": round(e.measured_fraction, 4),
                            "floor_block_ms": round(min(rows, key=lambda r: r.tier).block_ms, 3) if rows else None}
            self.samples.append(sample)
            await asyncio.sleep(self.every_s)

    def summary(self) -> dict:
        """Device-wide: the priced load (Σ busy_fraction) and the measured one (Σ measured_fraction), their
        p50 and max over the run, and the floor block price every host's heartbeat carried (p50, max)."""
        priced = [sum(h["busy_fraction"] for h in s["hosts"].values()) for s in self.samples if s["hosts"]]
        measured = [sum(h["measured_fraction"] for h in s["hosts"].values()) for s in self.samples if s["hosts"]]
        block = [h["floor_block_ms"] for s in self.samples for h in s["hosts"].values() if h["floor_block_ms"]]
        return {"device_busy_fraction_p50": percentile(priced, 50), "device_busy_fraction_max": max(priced, default=0.0),
                "device_measured_fraction_p50": percentile(measured, 50),
                "device_measured_fraction_max": max(measured, default=0.0),
                "floor_block_ms_p50": percentile(block, 50), "floor_block_ms_max": max(block, default=0.0),
                "samples": len(self.samples)}
