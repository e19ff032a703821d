"""What a fault cost, read from the authorities rather than from the client's hopes.

- **lost**: acknowledged items the final owner's state does not reflect once input has stopped
  (`consumed_seq` from the owner itself; its runtime refuses a gap or a repeated seq).
- **applied twice**: an item the block journal records in two different blocks.
- **dual authorizations**: a claim or release in the ownership log that the fencing rules forbid
  (folded with `libs.fence.core`), plus output chunks published unmarked twice with different
  bytes (two owners producing different blocks under one index).
- **recovery**: from the fault until every session has both a new acknowledgement and a new
  output block; a session is **affected** when across the fault its input went unacknowledged for
  over a second, its output paused longer than two periods, or blocks published meanwhile never
  reached the client.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import asdict, dataclass

from bench.frontend import SessionClient
from libs import bus, names
from libs.fence import block_journal, core
from libs.fence.ownership import read_owner
from libs.schemas.base import decode
from libs.schemas.engine import SessionInfo, SessionRef
from libs.schemas.fence import Assign, BlockEntry, Claim, LogRecord, Owner, Release


@dataclass
class SessionAudit:
    session_id: str
    owner: str
    acked: int
    consumed_seq: int
    lost: int
    applied_twice: int
    dual_authorizations: int

    def asdict(self) -> dict:
        return asdict(self)


async def read_log(js, session_id: str) -> list[LogRecord]:
    records, pos = [], 1
    while True:
        raw = await bus.next_msg(js, names.SESSION_STREAM, names.session_log_subject(session_id), pos,
                                 what="the session log")
        if raw is None:
            return records
        records.append(decode(raw.data, LogRecord))
        pos = raw.seq + 1


def log_violations(records: list[LogRecord]) -> int:
    """Records of the ownership log that break a fencing rule (0 for a correct log)."""
    view, version, bad = core.EMPTY, 0, 0
    for record in records:
        event = record.event
        if isinstance(event, Assign):
            bad += event.version != version + 1
            version = event.version
        elif isinstance(event, Claim):
            bad += view.owner != Owner(server_id=event.server_id, version=event.version) or view.claim is not None
        elif isinstance(event, Release):
            seqs = [i.seq for i in event.items]
            bad += core.current_owner(view) != Owner(server_id=event.server_id, version=event.version)
            bad += seqs != list(range(view.released + 1, view.released + 1 + len(seqs)))
        view = core.apply(view, event)
        bad += view != record.view
    return bad


def journal_duplicates(entries: list[BlockEntry]) -> int:
    """Items the journal records in more than one block (a block recorded twice with the same items is
    the same block, e.g. before and after a regeneration)."""
    block_of: dict[int, int] = {}
    twice: set[int] = set()
    for entry in entries:
        for b in entry.blocks:
            for seq in range(b.first_seq, b.last_seq + 1):
                if block_of.setdefault(seq, b.block) != b.block:
                    twice.add(seq)
    return len(twice)


async def _owner_info(nc, sid: str) -> tuple[str, SessionInfo | None]:
    view = (await read_owner(nc.jetstream(), sid)).view
    if view.claim is None or view.claim != view.owner:
        return (view.owner.server_id if view.owner else ""), None
    info = await bus.request(nc, names.engine_subject(view.claim.server_id, "info"),
                             SessionRef(session_id=sid), SessionInfo, timeout_s=2.0)
    return view.claim.server_id, info


async def audit(nc, clients: list[SessionClient], timeout_s: float = 60.0) -> list[SessionAudit]:
    """After input stopped: wait (bounded, all sessions at once) until each session's claimed owner
    reflects every acknowledged item, then count what was lost, applied twice or authorized twice."""
    return list(await asyncio.gather(*(_audit_one(nc, c, timeout_s) for c in clients)))


async def _audit_one(nc, c: SessionClient, timeout_s: float) -> SessionAudit:
    js = nc.jetstream()
    last = max(c.acked, default=0)
    owner, info = "", None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            owner, info = await _owner_info(nc, c.sid)
            if info is not None and info.consumed_seq >= last:
                break
        await asyncio.sleep(0.2)
    consumed = info.consumed_seq if info is not None else 0
    _, tail = await block_journal.read_tail(js, c.sid)
    entries = [e for _, e in await block_journal.read_all(js, c.sid, tail)]
    distinct = len(set(c.acked))
    return SessionAudit(
        session_id=c.sid, owner=owner, acked=last, consumed_seq=consumed,
        # anything acknowledged and not in the owner's state is lost
        lost=max(0, last - consumed),
        # acks must be 1..last, each once: a seq we never got back is an item stored a second time
        applied_twice=journal_duplicates(entries) + (last - distinct) + max(0, consumed - last),
        dual_authorizations=log_violations(await read_log(js, c.sid)) + c.live_chunks_twice)


def recovery_s(clients: list[SessionClient], fault_at: float) -> float:
    """Seconds from the fault until every session had a new ack and a new live block (inf: not yet)."""
    worst = 0.0
    for c in clients:
        new_block = _first_new_block(c, fault_at)
        new_ack = next((t for t in c.ack_times if t > fault_at), None)
        if new_block is None or new_ack is None:
            return float("inf")
        worst = max(worst, new_block.at - fault_at, new_ack - fault_at)
    return worst


INPUT_STALL_S = 1.0


def stalled(c: SessionClient, fault_at: float) -> bool:
    """Across the fault the session's input went unacknowledged for over a second, its live output
    paused for more than two periods, or blocks never reached the client (output is core NATS:
    what is published during an outage is gone)."""
    acked_before = [t for t in c.ack_times if t <= fault_at]
    acked_after = next((t for t in c.ack_times if t > fault_at), None)
    if acked_before and acked_after is not None and acked_after - acked_before[-1] > INPUT_STALL_S:
        return True
    before = [a for a in c.live_blocks() if a.at <= fault_at]
    new = _first_new_block(c, fault_at)
    if new is None or not before:
        return new is None
    return new.at - before[-1].at > 2 * c.period_s or new.block > before[-1].block + 1


def _first_new_block(c: SessionClient, fault_at: float):
    """The first live block after the fault with an index past every block shown before it."""
    last = max((a.block for a in c.live_blocks() if a.at <= fault_at), default=-1)
    return next((a for a in c.live_blocks() if a.at > fault_at and a.block > last), None)
