"""The source side of a move: stop-and-copy at a block boundary, or iterative pre-copy.

Stop-and-copy holds the block boundary for the whole transfer. Pre-copy sends
every chunk while the session keeps generating (each chunk is first copied to a
bounce buffer so the bytes sent are exactly the bytes checksummed), then
re-checksums every chunk to find the dirty set and resends it, up to a round
cap or until the dirty fraction converges; the final round is frozen at a block
boundary and its CRCs, taken under the freeze, define the manifest.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from libs.errors import Conflict, IntegrityError
from libs.motion import checksum, crc, manifest
from libs.motion.host import StateHost
from libs.motion.slot import chunks_of, staged_digest
from libs.motion.transport import Channel, Chunk
from libs.schemas.motion import Manifest, MigrateResult

OpenChannel = Callable[[Manifest], Awaitable[Channel]]


@dataclass(frozen=True, slots=True)
class SendOptions:
    mode: str = "stop_and_copy"
    round_cap: int = 4
    converge_fraction: float = 0.05
    chunk_bytes: int = 1 << 20


def chunk_grid(flat: manifest.Flat, chunk_bytes: int) -> list[Chunk]:
    return [(i, off, n) for i, t in enumerate(flat.tensors)
            for off, n in chunks_of(t.numel() * t.element_size(), chunk_bytes)]


async def send_chunks(ch: Channel, flat: manifest.Flat, chunks: list[Chunk], *, bounce: bool,
                      checksum: bool = True) -> list[int]:
    """Send `chunks` as one round; returns their CRCs."""
    crcs = await ch.put_many([crc.byte_view(t) for t in flat.tensors], chunks, bounce=bounce, checksum=checksum)
    await ch.end_round()
    return crcs


async def chunk_crcs(flat: manifest.Flat, chunks: list[Chunk], kind: str = checksum.CRC32C) -> list[int]:
    loop = asyncio.get_running_loop()
    views = [crc.byte_view(t) for t in flat.tensors]
    futs = [loop.run_in_executor(crc.pool, lambda c=c: checksum.of_bytes(kind, views[c[0]][c[1]:c[1] + c[2]], c[1]))
            for c in chunks]
    return list(await asyncio.gather(*futs))


def leaf_crcs_from_chunks(flat: manifest.Flat, chunks: list[Chunk], crcs: list[int],
                          kind: str = checksum.CRC32C) -> list[int]:
    per_leaf: list[tuple[list[int], list[int]]] = [([], []) for _ in flat.tensors]
    for (leaf, _, n), value in zip(chunks, crcs, strict=True):
        per_leaf[leaf][0].append(value)
        per_leaf[leaf][1].append(n)
    return [checksum.combine(kind, v, n) for v, n in per_leaf]


def _flat_now(host: StateHost, session_id: str, topology: int | None) -> manifest.Flat:
    flat = manifest.flatten(host.state_tree(session_id))
    meta = [(manifest.dtype_name(t.dtype), list(t.shape)) for t in flat.tensors]
    if topology is not None and manifest.topology(flat.paths, meta) != topology:
        raise Conflict("the session's tensor structure changed during pre-copy", session_id=session_id)
    return flat


async def send_state(host: StateHost, session_id: str, open_channel: OpenChannel, opts: SendOptions,
                     hold: contextlib.AsyncExitStack, tier: str = "T0") -> MigrateResult:
    """Send the session's state; the final round runs under the session's block boundary, which is
    entered on `hold` and stays held when this returns: the caller releases it once the move is
    decided (the source stays frozen through verify, commit and the ownership handoff, so it never
    runs a block the destination will not continue from)."""
    started = time.monotonic()
    rounds: list[float] = []
    ch: Channel | None = None
    try:
        sent: list[int] | None = None
        topo: int | None = None
        if opts.mode == "precopy":
            flat = _flat_now(host, session_id, None)
            layout = manifest.build(session_id, flat, [0] * len(flat.tensors), tier=tier)
            topo = layout.topology
            ch = await open_channel(layout)
            chunks = chunk_grid(flat, opts.chunk_bytes)
            sent = await send_chunks(ch, flat, chunks, bounce=True)
            rounds.append(1.0)
            for _ in range(1, opts.round_cap):
                flat = _flat_now(host, session_id, topo)
                now = await chunk_crcs(flat, chunks, ch.checksum)
                dirty = [i for i, (a, b) in enumerate(zip(now, sent, strict=True)) if a != b]
                rounds.append(len(dirty) / max(len(chunks), 1))
                if rounds[-1] <= opts.converge_fraction:
                    break
                fresh = await send_chunks(ch, flat, [chunks[i] for i in dirty], bounce=True)
                for i, value in zip(dirty, fresh, strict=True):
                    sent[i] = value
        await hold.enter_async_context(host.block_boundary(session_id))
        frozen = time.monotonic()
        flat = _flat_now(host, session_id, topo)
        descriptor = host.session_descriptor(session_id)
        chunks = chunk_grid(flat, opts.chunk_bytes)
        if ch is None:
            layout = manifest.build(session_id, flat, [0] * len(flat.tensors), tier=tier)
            ch = await open_channel(layout)
            final = await send_chunks(ch, flat, chunks, bounce=False)
            rounds.append(1.0)
        else:
            assert sent is not None
            final = await chunk_crcs(flat, chunks, ch.checksum)
            dirty = [i for i, (a, b) in enumerate(zip(final, sent, strict=True)) if a != b]
            rounds.append(len(dirty) / max(len(chunks), 1))
            await send_chunks(ch, flat, [chunks[i] for i in dirty], bounce=False)
        leaf_crcs = leaf_crcs_from_chunks(flat, chunks, final, ch.checksum)
        digest = await ch.finish()
        freeze_s = time.monotonic() - frozen
        if digest != staged_digest(leaf_crcs, ch.checksum):
            raise IntegrityError("the receiver staged different bytes than were sent", session_id=session_id)
        m = manifest.build(session_id, flat, leaf_crcs, tier=tier, descriptor=descriptor, kind=ch.checksum)
        return MigrateResult(manifest=m, rounds=rounds, wire_bytes=ch.wire_bytes,
                             transfer_s=time.monotonic() - started, freeze_s=freeze_s)
    finally:
        if ch is not None:
            await ch.close()
