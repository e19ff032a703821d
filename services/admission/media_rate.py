"""A streamed (C1) session's period against the media its backend makes per block. Pure.

A C1 session gets one block every `period_ms`, and each block carries `media_s_per_block` of
media (the backend's, from the hosts' profile rows). Unless the two agree the stream runs
faster or slower than real time (a world block is 66.7 ms of media: released every 100 ms it
plays at 2/3 speed), which no serving can fix: such a contract is refused with the reason.
A C1 contract that leaves `period_ms` out gets the backend's own.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from libs.contracts import Contract
from libs.errors import Rejected
from libs.schemas.common import ProfileRow

TOLERANCE = 0.01  # a period within 1% of the media per block counts as real time


def complete(contract: Contract, backend: str, rows: Iterable[ProfileRow]) -> Contract:
    """The contract with a C1 period filled in from the backend, or `Rejected` if its period cannot be real time.
    Unchanged when no live host measures the backend (admission then says why it cannot place it)."""
    if contract.session_class != "C1":
        return contract
    media = sorted({r.media_s_per_block for r in rows if r.backend == backend and r.media_s_per_block > 0})
    if not media:
        return contract
    media_ms = media[0] * 1000
    if contract.period_ms is None:
        return msgspec.structs.replace(contract, period_ms=media_ms)
    if abs(contract.period_ms - media_ms) > TOLERANCE * media_ms:
        speed = media_ms / contract.period_ms
        raise Rejected(f"backend {backend!r} makes {media_ms:.1f} ms of media per block; one block every "
                       f"{contract.period_ms:g} ms would stream at {speed:.2f}x real time (leave period_ms out "
                       f"to take {media_ms:.1f})", reason="incoherent_contract", field="period_ms",
                       fields="period_ms", media_ms_per_block=media_ms)
    return contract
