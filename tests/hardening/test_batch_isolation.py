"""An error in a coalesced batch fails only the session whose block raised it; the stage that
raised keeps serving, and the other sessions of the batch complete their block."""

from __future__ import annotations

import torch

from libs.schemas.engine import OpenSession, SessionInit
from services.engine_host.backends.avatar import AvatarBackend
from services.engine_host.backends.spec import StateLayoutError
from services.engine_host.metrics import SessionStats
from services.engine_host.pipeline import StagePipeline
from services.engine_host.scheduler import Dispatch
from services.engine_host.session import Session
from services.engine_host.stages import BlockJob, block_stages
from services.engine_host.work import Item, Work


def session(backend: AvatarBackend, sid: str) -> Session:
    return Session(spec=OpenSession(session_id=sid, backend="avatar", seed=1, session_class="C1", period_ms=400.0,
                                    determinism="T1"),
                   backend=backend, shape="avatar", state=backend.init_state(1, SessionInit(prompt=sid)),
                   stats=SessionStats(sid, "avatar", backend.media_s_per_block, 0.0))


async def run_batch(sessions: list[Session], seq: int) -> list[Item]:
    out: list[Item] = []

    async def sink(w: Work) -> None:
        out.extend(w.items)

    pipe = StagePipeline(block_stages(), sink)
    pipe.start()
    for s in sessions:
        await pipe.open(s.sid)
    for n in range(seq + 1):
        items = [Item(sid=s.sid, seq=n, epoch=0, data=BlockJob(session=s, inputs=[b"hi"], last_seq=0,
                                                                 accepted_at=[0.0]))
                 for s in sessions]
        await pipe.submit(Work(items=items, meta=Dispatch(sids=tuple(s.sid for s in sessions), tier=1, start=0.0,
                                                          deadlines=(0.0,) * len(sessions)),
                               key=sessions[0].sid))
    for s in sessions:
        await pipe.close(s.sid)
    await pipe.shutdown()
    return out


async def test_a_poisoned_session_in_a_coalesced_denoise_fails_alone():
    torch.set_num_threads(1)
    backend = AvatarBackend()
    good, bad, other = (session(backend, sid) for sid in ("good", "bad", "other"))
    bad.state["prosody"] = torch.zeros((3, 5))  # a broken state: its denoise raises, the batch's with it
    blocks_before = {s.sid: s.state["block"] for s in (good, bad, other)}
    out = await run_batch([good, bad, other], seq=1)
    by_sid: dict[str, list[Item]] = {}
    for it in out:
        by_sid.setdefault(it.sid, []).append(it)
    assert all(it.error is not None for it in by_sid["bad"])
    for sid, s in (("good", good), ("other", other)):
        assert [it.error for it in by_sid[sid]] == [None, None]
        assert all(it.data.output is not None for it in by_sid[sid])
        assert s.state["block"] == blocks_before[sid] + 2  # each block advanced it exactly once


async def test_an_encode_error_fails_only_its_session():
    backend = AvatarBackend()
    good, bad = session(backend, "good"), session(backend, "bad")
    del bad.state["speaker"]  # encode's leaf check raises for this session alone, naming the leaf
    out = await run_batch([good, bad], seq=0)
    errors = {it.sid: it.error for it in out}
    assert errors["good"] is None
    assert isinstance(errors["bad"], StateLayoutError) and errors["bad"].fields["leaf"] == "speaker"
