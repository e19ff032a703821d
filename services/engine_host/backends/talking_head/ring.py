"""The pending-audio ring of a talking-head session: state tensors written in place, counters as scalars.

Positions are absolute sample counts since the session began: `head` (samples written), `tail`
(samples consumed or dropped); `head − tail` samples wait, at `ring[pos % capacity]`. A segment
mark is the `head` a `segment_end` arrived at, kept with its item seq in `marks` (a fixed table:
the first `marks_n` rows, oldest first). Everything here is a pure function of the state and the
items applied, so a replayed block consumes and drops exactly what the original did.
"""

from __future__ import annotations

import torch


def push(state: dict, pcm: torch.Tensor) -> int:
    """Append int16 samples; what does not fit is dropped (newest first) and counted. Returns samples kept."""
    ring = state["ring"]
    cap = ring.shape[0]
    n = min(pcm.shape[0], cap - (state["head"] - state["tail"]))
    state["overflow"] += pcm.shape[0] - n
    start = state["head"] % cap
    first = min(n, cap - start)
    ring[start:start + first].copy_(pcm[:first])
    ring[: n - first].copy_(pcm[first:n])
    state["head"] += n
    return n


def take(state: dict, n: int) -> torch.Tensor:
    """Consume up to `n` waiting samples (a copy, int16); they count as played."""
    ring = state["ring"]
    cap = ring.shape[0]
    n = min(n, state["head"] - state["tail"])
    start = state["tail"] % cap
    first = min(n, cap - start)
    out = torch.cat([ring[start:start + first], ring[: n - first]]).clone()
    state["tail"] += n
    state["played"] += n
    return out


def drop_all(state: dict) -> int:
    """Drop every waiting sample and every pending mark; returns the samples dropped."""
    n = state["head"] - state["tail"]
    state["tail"] = state["head"]
    state["dropped"] += n
    state["marks_n"] = 0
    return n


def add_mark(state: dict, seq: int) -> tuple[int, int] | None:
    """Mark the segment ending at the current head. With the table full the oldest mark is returned
    (its segment is answered now, ahead of its audio) and its row reused."""
    marks, n = state["marks"], state["marks_n"]
    evicted = None
    if n == marks.shape[0]:
        evicted = (int(marks[0, 0]), int(marks[0, 1]))
        marks[:-1].copy_(marks[1:].clone())
        n -= 1
    marks[n, 0], marks[n, 1] = state["head"], seq
    state["marks_n"] = n + 1
    return evicted


def due_marks(state: dict) -> list[tuple[int, int]]:
    """Pop the marks whose audio has all been consumed (position ≤ tail): (position, item seq), oldest first."""
    marks, n = state["marks"], state["marks_n"]
    due = 0
    while due < n and int(marks[due, 0]) <= state["tail"]:
        due += 1
    if not due:
        return []
    done = [(int(p), int(s)) for p, s in marks[:due].tolist()]
    marks[: n - due].copy_(marks[due:n].clone())
    state["marks_n"] = n - due
    return done
