"""The whole stack dies at once: `statefleet up` and every process under it (nats-server, fence,
admission, both placements, the mover, the engine hosts) are SIGKILLed mid-traffic, then `up` is
started again on the same data dir.

Invariant: every session resumes from the checkpoint it had before the crash (or a later one) on a
new incarnation of an engine host, at a higher version, and serves again; no acknowledged input is
lost or applied twice, and the ownership log keeps the fencing rules (audited from the authorities:
the owner's `consumed_seq`, the block journal and the log, as the chaos drills do).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time

import aiohttp
import pytest

from bench.audit import audit
from bench.frontend import c1_contract, open_session
from bench.stack import UpStack, children_of
from libs import bus, names
from libs.fence.ownership import read_owner
from libs.schemas.fence import MetaRequest, SessionMeta, SessionView
from tests.support.waiting import eventually

pytestmark = pytest.mark.slow

# Fast beats, checkpoints and grace keep the crash and the recovery inside a few seconds.
ENV = {"SF_HEARTBEAT_S": "0.5", "SF_CHECKPOINT_EVERY_S": "0.5", "SF_ORPHAN_GRACE_S": "1.0",
       "SF_TORCH_THREADS": "1", "SF_PROFILE_BLOCKS": "1"}
SESSIONS = 3


def kill_everything(stack: UpStack) -> None:
    """SIGKILL `up` and each of its children, none given a chance to say goodbye."""
    pids = [stack.proc.pid, *children_of(stack.proc.pid)]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    stack.proc.wait()
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in pids[1:]):
        assert time.monotonic() < deadline, "a child outlived the SIGKILL"
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with contextlib.suppress(OSError):  # a zombie (reaped by init later) is dead
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
    return False


async def meta(nc, sid: str) -> SessionMeta:
    return await bus.request(nc, names.FENCE_META, MetaRequest(session_id=sid), SessionMeta)


def restores(data_dir, sid: str) -> list[dict]:
    """The `restored` events the engine hosts logged for `sid` (JSON lines, all incarnations)."""
    out = []
    for path in (data_dir / "logs").glob("engine-*.log"):
        for line in path.read_text(errors="replace").splitlines():
            if '"restored"' in line and sid in line:
                with contextlib.suppress(ValueError):
                    event = json.loads(line)
                    if event.get("event") == "restored" and event.get("session_id") == sid:
                        out.append(event)
    return out


@pytest.mark.timeout(240)
async def test_whole_stack_sigkilled_and_restarted_resumes_every_session_from_its_checkpoint(tmp_path):
    data = tmp_path / "var"
    stack = UpStack(data, engines=2, env=ENV)
    stack.start()
    http = nc = None
    try:
        await stack.ready()
        http = aiohttp.ClientSession(headers=stack.admin_headers())
        nc = await bus.connect(stack.cli_url(), name="crash-observer")
        clients = [await open_session(nc, http, stack.admission_url, c1_contract(), seed=i + 1)
                   for i in range(SESSIONS)]
        for c in clients:
            c.start_input(http, 0.1)

        async def checkpointed() -> dict[str, SessionMeta]:
            metas = {c.sid: await meta(nc, c.sid) for c in clients}
            return metas if all(m.checkpoint_cursor >= 3 for m in metas.values()) else {}

        before = await eventually(checkpointed, 60, every_s=0.2)
        owners = {c.sid: (await read_owner(nc.jetstream(), c.sid)).view for c in clients}
        await nc.close()
        nc = None

        kill_everything(stack)
        acked_at_kill = {c.sid: max(c.acked, default=0) for c in clients}
        stack.start()  # the same data dir: NATS's store, the checkpoints, the admin token
        await stack.ready()
        nc = await bus.connect(stack.cli_url(), name="crash-observer-2")
        js = nc.jetstream()

        behind: dict[str, SessionView] = {}  # the sessions not resumed yet, as the log shows them

        async def resumed() -> bool:
            behind.clear()
            for c in clients:
                view = (await read_owner(js, c.sid)).view
                old = owners[c.sid]
                if view.claim is None or view.claim != view.owner or view.owner.version <= old.owner.version \
                        or view.incarnation in ("", old.incarnation):
                    behind[c.sid] = view
            return not behind

        try:
            await eventually(resumed, 60, every_s=0.2)
        except AssertionError as e:
            raise AssertionError(f"not resumed: {behind} (before the crash: {owners})") from e
        for c in clients:  # input goes on past the crash: new acks, and the new owner serves them
            await eventually(lambda c=c: _true(len(c.acked) and c.acked[-1] > acked_at_kill[c.sid] + 3), 60, every_s=0.2)
        for c in clients:
            await c.stop_input()
        audits = await audit(nc, clients)
        for a in audits:
            assert a.lost == 0 and a.applied_twice == 0 and a.dual_authorizations == 0, a
            assert a.consumed_seq == a.acked > acked_at_kill[a.session_id]
        for c in clients:
            # The new incarnation restored a checkpoint at least as new as the one recorded before the
            # crash (a checkpoint only moves forward), not the seed.
            after_crash = [e for e in restores(data, c.sid) if e.get("cursor", -1) >= before[c.sid].checkpoint_cursor]
            assert after_crash, f"{c.sid} did not resume from its checkpoint: {restores(data, c.sid)}"
        assert not stack.violations()
    finally:
        if nc is not None:
            await nc.close()
        if http is not None:
            await http.close()
        stack.stop()


async def _true(value) -> bool:
    return bool(value)


