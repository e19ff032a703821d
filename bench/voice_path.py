"""Where bench.voice's audio-to-frame milliseconds go, measured along the path of each utterance's
first sample (one machine, so every process reads the same CLOCK_MONOTONIC):

    posted ──ingress──▶ stored at fence (the client's POST answered: HTTP + the JetStream store)
           ──engine path──▶ the block on the bus (`sf.output.<sid>`, seen by a subscriber of our own:
                            the gateway's release, the engine's wait for its next release on the
                            160 ms grid, the block's stages, the journal append, PNG, any playout hold)
           ──egress──▶ the block at the client (fence's output socket, the client's reassembly)

Inside the engine path the hosts' own serving metrics split it further (`statefleet engines`):
control-to-output (an item accepted → its block's stages done: the grid wait plus the stages),
the stages' means, and the playout hold. The grid wait is the floor of a periodic session: an
item waits for the next release, uniform over a period.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

import msgspec

from bench.common import percentile
from libs import bus, errors, names
from libs.schemas.engine import HostStatus, OutputChunk, StatusRequest
from statefleet.client import BlockAssembler

_chunk = msgspec.msgpack.Decoder(OutputChunk)


@dataclass
class BusWatch:
    """Each block of one session as it appears on the bus: when it was whole there (monotonic)."""

    whole_at: dict[int, float] = field(default_factory=dict)
    assembler: BlockAssembler = field(default_factory=lambda: BlockAssembler(gap_s=0.5))

    async def start(self, nc, sid: str) -> None:
        async def seen(msg) -> None:
            with contextlib.suppress(msgspec.DecodeError):
                for b in self.assembler.add(_chunk.decode(msg.data)):
                    self.whole_at[b.block] = b.received_at
        self.sub = await nc.subscribe(names.output_subject(sid), cb=seen)


@dataclass
class FirstSample:
    ingress_ms: float
    engine_path_ms: float
    egress_ms: float


def first_sample(stream, posted: float, block, watch: BusWatch) -> FirstSample | None:
    """The three legs of one utterance's first sample, or None where a leg was not seen."""
    stored = next((s for s in stream.stored if s.kind == "audio" and s.sent_at >= posted), None)
    on_bus = watch.whole_at.get(block.block)
    if stored is None or on_bus is None:
        return None
    return FirstSample((stored.stored_at - posted) * 1000, (on_bus - stored.stored_at) * 1000,
                       (block.received_at - on_bus) * 1000)


def legs(samples: list[FirstSample]) -> dict[str, float]:
    out: dict[str, float] = {}
    for leg in ("ingress_ms", "engine_path_ms", "egress_ms"):
        values = [getattr(s, leg) for s in samples]
        out[f"{leg}_p50"], out[f"{leg}_p95"] = percentile(values, 50), percentile(values, 95)
    out["samples"] = len(samples)
    return out


async def engine_split(nc, hosts: list[str], sids: set[str]) -> dict[str, float]:
    """The hosts' serving metrics of our sessions: the engine path's parts (medians over sessions)."""
    rows = []
    for host in hosts:
        with contextlib.suppress(errors.StatefleetError):
            st = await bus.request(nc, names.engine_subject(host, "status"), StatusRequest(), HostStatus,
                                   timeout_s=3.0)
            rows += [m for m in st.metrics if m.session_id in sids]
    if not rows:
        return {}
    stage_ms = [sum(s.mean_ms for s in m.stages) for m in rows]
    return {"sessions_reporting": len(rows),
            "control_to_output_ms_p50": percentile([m.control_to_output_p50_ms for m in rows], 50),
            "control_to_output_ms_p95": percentile([m.control_to_output_p95_ms for m in rows], 50),
            "stages_ms_mean": percentile(stage_ms, 50),
            "playout_hold_ms_p95": percentile([m.playout_hold_p95_ms for m in rows], 50),
            "chunk_period_ms_p95": percentile([m.chunk_period_p95_ms for m in rows], 50),
            "taken_at": time.time()}
