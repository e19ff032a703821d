"""Session classes and every rule that follows from a session's class: the one place they are spelled.

C1 is interactive (a block every period, streamed); C2a (planner fan-out) and C2b
(rollout cohort) are deadline-driven and periodic; C3 (bulk), C4 (replay) and C5
(maintenance) run blocks asked for in the slack the periodic classes leave.
Admission checks a contract against these rules; the engine host schedules by them.
Pure: no I/O.
"""

from __future__ import annotations

from typing import Literal, NoReturn, Protocol, get_args

from libs.errors import BadRequest

SessionClass = Literal["C1", "C2a", "C2b", "C3", "C4", "C5"]
DeterminismTier = Literal["T0", "T1", "T2"]
DecodeTier = Literal["full", "preview", "none"]
SESSION_CLASSES: tuple[SessionClass, ...] = get_args(SessionClass)

# The engine releases a block of these every period on its own; the deadline is the next release.
PERIODIC: tuple[SessionClass, ...] = ("C1", "C2a", "C2b")
# The others run the blocks asked for, in residual time, in this order of precedence.
BULK_ORDER: tuple[SessionClass, ...] = ("C3", "C4", "C5")

# Which window each class requires, allows or forbids.
_PERIOD_REQUIRED = {"C1"}
_DEADLINE_REQUIRED = {"C2a", "C2b"}
_DEADLINE_ALLOWED = {"C2a", "C2b", "C3", "C4"}
# Replay is only a replay if it reproduces the recorded run: bitwise (T0) or schedule-stable (T1).
_REPLAY_TIERS = {"T0", "T1"}


def coalescable(determinism: DeterminismTier) -> bool:
    """Whether a session's blocks may share a batched forward with other sessions'. A batch's
    composition is a scheduling accident that can change low bits, and T0/T1 promise the same
    bits whatever the schedule (exact recovery regenerates blocks alone), so only T2 coalesces."""
    return determinism not in _REPLAY_TIERS


class Declared(Protocol):
    """The fields of a contract the class rules read (`libs.contracts.Contract` has them)."""

    session_class: SessionClass
    determinism: DeterminismTier
    decode_tier: DecodeTier
    period_ms: float | None
    deadline_ms: float | None
    blocks_per_window: int


def check(c: Declared) -> None:
    """Raise `BadRequest` (reason `incoherent_contract`) naming the fields if `c` breaks its class's rules."""
    cls = c.session_class
    if cls in _PERIOD_REQUIRED and c.period_ms is None:
        reject(f"class {cls} is periodic and needs period_ms", "session_class", "period_ms")
    if cls not in _PERIOD_REQUIRED and c.period_ms is not None:
        reject(f"class {cls} has no period; period_ms is only for C1", "session_class", "period_ms")
    if cls in _DEADLINE_REQUIRED and c.deadline_ms is None:
        reject(f"class {cls} needs deadline_ms", "session_class", "deadline_ms")
    if cls not in _DEADLINE_ALLOWED and c.deadline_ms is not None:
        reject(f"class {cls} takes no deadline_ms", "session_class", "deadline_ms")
    if c.period_ms is None and c.deadline_ms is None and c.blocks_per_window != 1:
        reject("blocks_per_window needs a period_ms or deadline_ms", "blocks_per_window")
    if cls == "C4" and c.determinism not in _REPLAY_TIERS:
        reject(f"C4 replay must be T0 or T1, not {c.determinism}", "session_class", "determinism")
    if cls == "C1" and c.decode_tier == "none":
        reject("an interactive C1 session streams output; decode_tier cannot be none",
               "session_class", "decode_tier")
    if cls == "C5" and c.decode_tier != "none":
        reject("C5 maintenance produces no output; decode_tier must be none", "session_class", "decode_tier")


def release_period_ms(c: Declared) -> float:
    """How often the engine releases a block of the session (0.0: only when asked).

    C1 declares its period; C2a/C2b declare a deadline for `blocks_per_window` blocks,
    so they release one block every deadline / blocks_per_window.
    """
    if c.period_ms is not None:
        return c.period_ms
    if c.session_class in _DEADLINE_REQUIRED and c.deadline_ms:
        return c.deadline_ms / c.blocks_per_window
    return 0.0


def reject(detail: str, *fields: str, **extra: object) -> NoReturn:
    """The error of an incoherent contract: `field` is the first offending field, `fields` all of them."""
    raise BadRequest(detail, reason="incoherent_contract", field=fields[0], fields=",".join(fields), **extra)
