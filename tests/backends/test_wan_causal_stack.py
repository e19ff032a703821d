"""wan_causal on a real stack, as the other backends' contract tests run: nats-server, fence,
placement and the mover in this process, engine hosts as `statefleet serve engine_host`
processes configured by a backends file (`SF_BACKEND_CONFIGS`, a tiny random-weight config).

One session is live-moved by the mover (its moved leaves over the data plane, the decoder cache
sent or rebuilt as the hosts choose), goes on generating on the destination, and when that host is
SIGKILLed the replacement (no checkpoint: it starts from the seed and the prompt and regenerates
the journaled blocks) republishes and continues. Invariant: every block served, live or replayed,
equals an unmoved control's bit for bit."""

from __future__ import annotations

import asyncio

import msgspec
import pytest
import torch

from libs import bus, names
from libs.contracts import Contract
from libs.schemas.engine import Advance, OutputChunk, SessionInfo, SessionInit
from libs.schemas.motion import MoveReceipt, MoveRequest
from services.engine_host.backends.base import advance
from services.engine_host.backends.wan_causal import WanCausalBackend, WanCausalConfig
from services.engine_host.output import assemble
from tests.support.stack import Stack
from tests.support.waiting import eventually

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning")]

SEED, PROMPT, SID = 11, "a road at dusk", "wan-s"
# The backends file the hosts read: 2-frame blocks, a 1-frame sink and a 4-frame window (the ring
# wraps from the third block), two tiers
BACKENDS_TOML = """\
[wan_causal]
random_weights = true
embedder = "random"

[wan_causal.arch]
frames_per_block = 2
sink_frames = 1
window_frames = 4
step_list = [1000, 500]
"""
CONTRACT = Contract(session_class="C3", quality_floor=2, determinism="T0")  # tier 2 only: a fixed ladder


def control(blocks: int) -> list[torch.Tensor]:
    """The blocks an unmoved session gives, on one torch thread as the hosts run."""
    import tomllib

    config = msgspec.convert(tomllib.loads(BACKENDS_TOML)["wan_causal"], WanCausalConfig)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        backend = WanCausalBackend(config)
        state = backend.init_state(SEED, SessionInit(prompt=PROMPT))
        return [advance(backend, state, [], 2).frames for _ in range(blocks)]
    finally:
        torch.set_num_threads(threads)


def engines_up(stack: Stack, path, *host_ids: str):
    """Engine hosts that also profile wan_causal (its decoder alone takes seconds a block on a loaded 2-core
    machine), so a longer start-up deadline. No checkpoint during the test: the replacement regenerates every
    journaled block."""
    return stack.engines_up(*host_ids, answer_s=600, seen_s=60, SF_BACKEND_CONFIGS=str(path),
                            SF_CHECKPOINT_EVERY_S="3600")


async def create(stack: Stack) -> str:
    """Register, place and assign the session as admission does; the host it went to."""
    placement = await stack.create(SID, contract=CONTRACT, backend="wan_causal", seed=SEED, prompt=PROMPT, tier=2,
                                   claim_s=60)
    return placement.host_id


@pytest.mark.timeout(1500)
async def test_a_wan_causal_session_moves_live_and_fails_over_and_continues_bit_identically(stack, tmp_path):
    path = tmp_path / "backends.toml"
    path.write_text(BACKENDS_TOML)
    await stack.start(placements=1)
    await engines_up(stack, path, "e0", "e1")
    chunks: list[OutputChunk] = []

    async def on_chunk(c: OutputChunk) -> None:
        chunks.append(c)

    await bus.subscribe_events(stack.nc, names.output_subject(SID), OutputChunk, on_chunk)

    def frames(replayed: bool) -> dict[int, torch.Tensor]:
        """Block number (1-based) → its frames."""
        mine = [c for c in chunks if c.kind == "frames" and c.replayed == replayed]
        return {b: assemble([c for c in mine if c.block == b]) for b in sorted({c.block for c in mine})}

    async def run_blocks(host: str, n: int, total: int) -> None:
        await bus.request(stack.nc, names.engine_subject(host, "advance"), Advance(session_id=SID, blocks=n),
                          SessionInfo, timeout_s=300)
        await eventually(lambda: asyncio.sleep(0, len(frames(False)) == total), 60)

    first = await create(stack)
    second = "e1" if first == "e0" else "e0"
    await run_blocks(first, 2, 2)
    receipt = await bus.request(stack.nc, names.MOVER_MOVE, MoveRequest(session_id=SID, source=first, dest=second,
                                                                        deadline_s=120.0), MoveReceipt, timeout_s=300)
    assert receipt.outcome == "committed", receipt
    await eventually(lambda: stack.claimed_by(SID, second, min_version=2), 60)
    await run_blocks(second, 2, 4)  # the ring has wrapped on the destination

    stack.engines[second].kill()
    await eventually(lambda: stack.claimed_by(SID, first, min_version=3), 60)
    await run_blocks(first, 1, 5)
    await eventually(lambda: asyncio.sleep(0, len(frames(True)) == 4), 120)
    want = dict(enumerate(control(5), 1))
    live, replayed = frames(False), frames(True)
    assert sorted(live) == [1, 2, 3, 4, 5] and sorted(replayed) == [1, 2, 3, 4]
    assert all(torch.equal(live[b], want[b]) for b in live), "a block served after the move or failover differs"
    assert all(torch.equal(replayed[b], want[b]) for b in replayed), "a regenerated block differs"
    assert not torch.equal(live[5], live[4])  # the session moves on
