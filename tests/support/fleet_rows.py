"""Engine hosts and contracts for admission and placement tests: measured-looking rows, no model constants."""

from __future__ import annotations

from libs.contracts import Contract
from libs.schemas.common import EngineEntry, ProfileRow

GIB = 1 << 30


def rows(backend: str = "world", tiers: dict[int, float] | None = None, state_bytes: int = 2 * GIB) -> list[ProfileRow]:
    """Profile rows: tier → block_ms (every stage of a block: what admission prices); the denoise
    quantum is two thirds of it."""
    tiers = tiers or {4: 10.0, 8: 20.0, 16: 40.0}
    return [ProfileRow(backend=backend, tier=t, quantum_ms=b / 1.5, block_ms=b, state_bytes=state_bytes,
                       media_s_per_block=0.1) for t, b in tiers.items()]


def host(host_id: str = "h0", *, busy: float = 0.0, free: int = 60 * GIB, memory: int = 80 * GIB,
         sessions: int = 0, at: float = 1000.0, profile: list[ProfileRow] | None = None,
         measured: int | None = None, session_ids: list[str] | None = None) -> EngineEntry:
    """`measured`: the sessions its prices were measured beside (default: all of them)."""
    return EngineEntry(host_id=host_id, device="cuda:0", memory_bytes=memory, free_memory_bytes=free,
                       sessions=sessions, heartbeat_at=at, profile=rows() if profile is None else profile,
                       busy_fraction=busy, measured_sessions=sessions if measured is None else measured,
                       session_ids=session_ids or [])


def c1(period_ms: float = 100.0, floor: int = 4, **kw) -> Contract:
    """An interactive session: one block every `period_ms`."""
    return Contract(session_class="C1", quality_floor=floor, determinism="T1", period_ms=period_ms, **kw)
