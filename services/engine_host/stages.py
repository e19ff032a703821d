"""The three stage bodies of a block: encode → denoise → decode, each run on its stage's thread.

A `BlockJob` is one session's block as it crosses the stages; a work carries the jobs of one
dispatch (a single block, or a coalesced batch of one shape and tier).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from services.engine_host.backends import Output
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
    carry: Any = None  # what one stage hands the next (the backend's own type)
    output: Output | None = None


BlockWork = Work[BlockJob, Dispatch]


def encode(work: BlockWork) -> None:
    for it in work.items:
        job = it.data
        job.carry = job.session.backend.encode(job.session.state, job.inputs)


def denoise(work: BlockWork) -> None:
    jobs = [it.data for it in work.items]
    backend = jobs[0].session.backend
    carries = backend.denoise_batch([j.session.state for j in jobs], [j.carry for j in jobs], work.meta.tier)
    for j, c in zip(jobs, carries, strict=True):
        j.carry = c


def decode(work: BlockWork) -> None:
    for it in work.items:
        job = it.data
        out = job.session.backend.decode(job.session.state, job.carry)
        if out.frames.device.type == "cuda":
            torch.cuda.synchronize(out.frames.device)
        job.output = out


def block_stages() -> list[Stage[BlockJob, Dispatch]]:
    return [Stage("encode", encode), Stage("denoise", denoise), Stage("decode", decode)]
