"""The three stage bodies of a block: encode → denoise → decode, each run on its stage's thread.

A `BlockJob` is one session's block as it crosses the stages; a work carries the jobs of one
dispatch (a single block, or a coalesced batch of one shape and tier).

Each stage body runs at its work's thread count (`Session.threads`): a T0/T1 session's blocks keep the
count it was started with on every host, so a replacement regenerates the same bytes.

An error fails only the session whose block raised it: encode and decode run per session and
mark just the item that raised; a coalesced denoise that raises is run again one session at a
time, so the sessions that did not cause it go on. That retry relies on `denoise_batch` changing
no state before every result is computed (both reference backends write state last).

Encode notes every tensor leaf of the session's state and decode checks each is still there, the same tensor over the same
memory at the same shape: a backend that rebinds or reshapes a leaf fails its session with an
error naming the leaf (the mover's manifest and chunk grid depend on a fixed layout).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from services.engine_host import torch_threads
from services.engine_host.backends import Output
from services.engine_host.backends.spec import LeafSnapshot, StateLayoutError
from services.engine_host.scheduler import Dispatch
from services.engine_host.session import Session
from services.engine_host.work import Stage, Work


@dataclass
class BlockJob:
    session: Session
    inputs: list[Any]  # the backend's parsed inputs this block folds in
    last_seq: int  # the session's consumed cursor once this block is done
    accepted_at: list[float]
    tier: int = 0  # denoise steps it ran at (recorded, so a regenerated block runs at the same)
    replayed: bool = False  # a regeneration of a block recorded in the journal
    release: float | None = None  # a C1 block's release on its grid: its output is paced from it (playout.py)
    carry: Any = None  # what one stage hands the next (the backend's own type)
    output: Output | None = None
    leaves: LeafSnapshot | None = None  # the state's tensor leaves as the block found them


BlockWork = Work[BlockJob, Dispatch]


def _pin(work: BlockWork) -> None:
    """Run the work at its sessions' thread count (one count: only T2 sessions, at the host's, share a work)."""
    torch_threads.pin(work.items[0].data.session.threads)


def encode(work: BlockWork) -> None:
    _pin(work)
    for it in work.items:
        job = it.data
        try:
            job.leaves = LeafSnapshot.take(job.session.state, job.session.backend.state_spec())
            job.carry = job.session.backend.encode(job.session.state, job.inputs)
        except Exception as e:
            it.error = e


def denoise(work: BlockWork) -> None:
    live = [it for it in work.items if it.error is None]
    if not live:
        return
    jobs = [it.data for it in live]
    backend = jobs[0].session.backend
    _pin(work)
    try:
        carries = backend.denoise_batch([j.session.state for j in jobs], [j.carry for j in jobs], work.meta.tier)
    except Exception:
        if len(live) == 1:
            raise
        for it in live:  # find the session that raised: each alone
            try:
                it.data.carry = backend.denoise(it.data.session.state, it.data.carry, work.meta.tier)
            except Exception as e:
                it.error = e
        return
    for j, c in zip(jobs, carries, strict=True):
        j.carry = c


def decode(work: BlockWork) -> None:
    _pin(work)
    for it in work.items:
        if it.error is not None:
            continue
        job = it.data
        try:
            out = job.session.backend.decode(job.session.state, job.carry)
            if out.frames.device.type == "cuda":
                torch.cuda.synchronize(out.frames.device)
        except Exception as e:
            it.error = e
            continue
        job.output = out
        assert job.leaves is not None
        try:
            job.leaves.verify(job.session.state)
        except StateLayoutError as e:  # only this session fails, not the others of a batch
            it.error = e


def block_stages() -> list[Stage[BlockJob, Dispatch]]:
    return [Stage("encode", encode), Stage("denoise", denoise), Stage("decode", decode)]
