"""Chaos drills' helpers (issue 22: shared from here, not from tests/chaos/conftest.py): the drill (a stack under
`statefleet up`, its sessions and the faults injected), what a drill records, and the audit's verdict."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from bench.audit import SessionAudit, audit, recovery_s, stalled
from bench.frontend import SessionClient, c1_contract, open_session
from bench.stack import UpStack
from libs import bus
from libs.fence.ownership import read_owner

RESULTS = Path(__file__).resolve().parents[2] / "var" / "chaos" / "results.json"
LOGS = RESULTS.parent / "logs"

# Fast heartbeats, checkpoints and orphan grace keep each drill short; one torch thread per host
# keeps two engine hosts from oversubscribing a small CPU.
# The fleet controller runs as it does by default (rebalancing, idle offload; no provisioner, so no scaling):
# each drill's fault must be survived with it deciding every second beside the recovery.
STACK_ENV = {"SF_HEARTBEAT_S": "0.5", "SF_CHECKPOINT_EVERY_S": "1.0", "SF_ORPHAN_GRACE_S": "1.0",
             "SF_TORCH_THREADS": "1", "SF_PROFILE_BLOCKS": "2"}
ITEM_EVERY_S = 0.1


@dataclass
class Drill:
    """One stack, its sessions and the faults injected into it."""

    stack: UpStack
    nc: object = None
    http: aiohttp.ClientSession | None = None
    clients: list[SessionClient] = field(default_factory=list)
    faults: list[tuple[str, float]] = field(default_factory=list)
    recoveries: list[float] = field(default_factory=list)
    affected: set[str] = field(default_factory=set)

    async def start(self) -> Drill:
        self.stack.start()
        await self.stack.ready()
        self.nc = await bus.connect(self.stack.cli_url(), name="chaos-observer")
        # Creation needs the admin credential; item posts carry their session's token instead.
        self.http = aiohttp.ClientSession(headers=self.stack.admin_headers())
        return self

    async def open(self, n: int) -> list[SessionClient]:
        for i in range(n):
            c = await open_session(self.nc, self.http, self.stack.admission_url, c1_contract(), seed=i + 1)
            c.start_input(self.http, ITEM_EVERY_S)
            self.clients.append(c)
        await self.serving()
        return self.clients

    async def serving(self, blocks: int = 3, timeout_s: float = 90.0) -> None:
        """Every session acknowledged input and showed `blocks` new live blocks since now."""
        since = time.monotonic()
        deadline = since + timeout_s
        while not all(sum(a.at > since for a in c.live_blocks()) >= blocks and c.ack_times
                      and c.ack_times[-1] > since for c in self.clients):
            if time.monotonic() >= deadline:
                raise AssertionError(f"sessions not serving within {timeout_s}s: {await self._progress(since)}")
            await asyncio.sleep(0.1)

    async def _progress(self, since: float) -> list[dict]:
        """What each session did since `since`, and who owns it: the failure message of `serving`."""
        now, rows = time.monotonic(), []
        for c in self.clients:
            live = c.live_blocks()
            row = {"sid": c.sid, "acks_since": sum(t > since for t in c.ack_times), "sent": c.sent,
                   "live_blocks_since": sum(a.at > since for a in live),
                   "last_block": live[-1].block if live else None,
                   "last_block_age_s": round(now - live[-1].at, 1) if live else None}
            with contextlib.suppress(Exception):
                view = (await read_owner(self.nc.jetstream(), c.sid)).view
                row["owner"], row["claim"] = str(view.owner), str(view.claim)
            rows.append(row)
        return rows

    def fault(self, what: str) -> float:
        at = time.monotonic()
        self.faults.append((what, at))
        return at

    async def recovered(self, fault_at: float, timeout_s: float = 120.0) -> float:
        """Wait until every session has a new ack and a new block after the fault; seconds it took."""
        deadline = time.monotonic() + timeout_s
        while (took := recovery_s(self.clients, fault_at)) == float("inf"):
            if time.monotonic() > deadline:
                self.recoveries.append(float("inf"))
                stuck = [c.sid for c in self.clients if recovery_s([c], fault_at) == float("inf")]
                raise AssertionError(f"not recovered within {timeout_s}s of the fault: {stuck}")
            await asyncio.sleep(0.2)
        self.recoveries.append(took)
        self.affected |= {c.sid for c in self.clients if stalled(c, fault_at)}
        return took

    async def finish(self) -> list[SessionAudit]:
        for c in self.clients:
            await c.stop_input()
        return await audit(self.nc, self.clients)

    async def close(self) -> None:
        for c in self.clients:
            c._stop.set()
            if c._task is not None and not c._task.done():
                c._task.cancel()
        if self.http is not None:
            await self.http.close()
        if self.nc is not None:
            await self.nc.close()


def record(chaos_results: dict, name: str, d: Drill, audits: list[SessionAudit], **extra) -> dict:
    row = {
        "faults_injected": len(d.faults),
        "faults": [what for what, _ in d.faults],
        "sessions": len(d.clients),
        "sessions_affected": len(d.affected),
        "inputs_acked": sum(a.acked for a in audits),
        "inputs_lost": sum(a.lost for a in audits),
        "inputs_applied_twice": sum(a.applied_twice for a in audits),
        "dual_authorizations": sum(a.dual_authorizations for a in audits),
        "recovery_s_max": round(max(d.recoveries, default=0.0), 2),
        "recovery_s": [round(r, 2) for r in d.recoveries],
        "sessions_detail": [a.asdict() for a in audits],
        "at": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        **extra,
    }
    row["passed"] = row["inputs_lost"] == 0 and row["inputs_applied_twice"] == 0 and row["dual_authorizations"] == 0
    chaos_results[name] = row
    return row


def assert_clean(row: dict) -> None:
    assert row["inputs_lost"] == 0, row
    assert row["inputs_applied_twice"] == 0, row
    assert row["dual_authorizations"] == 0, row
    assert row["recovery_s_max"] < float("inf"), row
