"""What flows through the stage pipeline: items (one session's block), works (the unit the stages
process together) and the stages themselves. Generic over the payload a stage reads and writes
(`P`) and what the dispatcher attaches to a whole work (`M`); the pipeline never looks inside either."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, Literal, TypeVar

P = TypeVar("P")
M = TypeVar("M")

# Why a stage left an item behind: no slot (the session was never opened there), an old epoch or a
# gap (the stream it belonged to was superseded), or a seq it already ran. Each is a pipeline counter.
DropReason = Literal["orphaned", "stale", "duplicate"]


@dataclass
class Item(Generic[P]):
    """One session's block inside a unit of work."""

    sid: str
    seq: int
    epoch: int
    data: P
    error: BaseException | None = None


@dataclass
class Work(Generic[P, M]):
    """A unit the stages process together: one block, or a coalesced batch of several sessions' blocks."""

    items: list[Item[P]]
    meta: M
    key: str = ""  # the session whose FIFO carries it on every edge (the lead of a batch)
    stage_ms: dict[str, float] = field(default_factory=dict)
    dropped: list[tuple[Item[P], DropReason]] = field(default_factory=list)  # left behind by a stage


@dataclass(frozen=True)
class Stage(Generic[P, M]):
    name: str
    run: Callable[[Work[P, M]], None]  # runs on the stage's thread; reads/writes item.data
    release: Callable[[str, dict], None] | None = None  # frees a session's stage slot (on the stage's thread)
