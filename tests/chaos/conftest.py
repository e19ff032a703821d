"""Chaos drills: a whole stack under `statefleet up` (real nats-servers on loopback, real processes),
simulated frontends feeding sessions, one kind of fault injected mid-traffic, then an audit.

Every drill records what it measured in `var/chaos/results.json` (keyed by test, so the file
holds each drill's latest run); `python -m bench.reliability_table` turns it into
docs/reliability.md's table. Run with `make chaos`; the default `make test` leaves them out.
"""

from __future__ import annotations

import json
import shutil

import pytest

from bench.stack import UpStack
from tests.support.chaos import LOGS, RESULTS, STACK_ENV, Drill


@pytest.fixture(scope="session")
def chaos_results():
    """Each drill's record; merged into var/chaos/results.json when the run ends."""
    rows: dict[str, dict] = {}
    yield rows
    if not rows:
        return
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    kept = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    kept.update(rows)
    RESULTS.write_text(json.dumps(kept, indent=2, sort_keys=True) + "\n")


@pytest.fixture
async def drill(tmp_path, request, chaos_results):
    """A factory for the test's one drill; records and stops it at the end."""
    made: list[Drill] = []

    async def start(engines: int = 2, nats_url: str = "", **env: str) -> Drill:
        stack = UpStack(tmp_path / "var", engines=engines, nats_url=nats_url, env={**STACK_ENV, **env})
        d = Drill(stack)
        made.append(d)
        return await d.start()

    yield start
    for d in made:
        await d.close()
        d.stack.stop()
        # Each drill's latest service logs are kept for diagnosis (tmp dirs rotate away).
        kept = LOGS / request.node.name
        shutil.rmtree(kept, ignore_errors=True)
        shutil.copytree(d.stack.data_dir / "logs", kept, dirs_exist_ok=True)
