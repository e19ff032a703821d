"""Start-up rows are one consistent set (`profile.consistent`): noise only ever adds time, so where two
measurements bound one cost the cheaper holds: a lone block is the cheaper of the lone row and the
curve's first point, and no tier costs more than a higher tier of its backend, at every curve point."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from libs.schemas.common import ProfileRow
from services.engine_host.profile import consistent

ms = st.floats(min_value=0.1, max_value=100.0)


def row(backend: str, tier: int, block: float, curve: list[float]) -> ProfileRow:
    return ProfileRow(backend=backend, tier=tier, quantum_ms=block / 2, block_ms=block, state_bytes=1,
                      media_s_per_block=0.1, colocated=curve)


def test_a_cold_first_tier_is_bounded_by_its_curve_and_the_tier_above():
    rows = [row("world", 1, 5.61, [2.34, 2.93, 3.44]), row("world", 2, 3.48, [4.19, 4.64, 4.67]),
            row("world", 4, 5.58, [6.07, 7.2, 7.19])]
    out = consistent(rows)
    assert [r.block_ms for r in out] == [2.34, 3.48, 5.58]
    assert out[0].colocated == [2.34, 2.93, 3.44]
    assert out[1].colocated == [3.48, 4.64, 4.67]  # its lone point is its lone row, the cheaper of the two
    assert out[0].quantum_ms == pytest.approx(2.34 / 2)  # the denoise share of the block is kept
    assert [r.tier for r in out] == [1, 2, 4]  # order kept
    assert out[2].block_ms == 5.58 and out[2].colocated == [5.58, 7.2, 7.19]  # the top tier: only its own two lone readings


@given(st.lists(st.tuples(ms, st.lists(ms, min_size=3, max_size=3)), min_size=1, max_size=4),
       st.lists(st.tuples(ms, st.lists(ms, min_size=3, max_size=3)), min_size=1, max_size=3))
def test_rows_come_out_monotone_in_tier_never_dearer_and_per_backend(world, dit):
    rows = [row("world", 1 << i, b, c) for i, (b, c) in enumerate(world)]
    rows += [row("dit", 1 << i, b, c) for i, (b, c) in enumerate(dit)]
    out = consistent(rows)
    assert [(r.backend, r.tier) for r in out] == [(r.backend, r.tier) for r in rows]
    for before, after in zip(rows, out, strict=True):
        assert after.block_ms <= before.block_ms and after.block_ms <= before.colocated[0]
        assert all(a <= b for a, b in zip(after.colocated, before.colocated, strict=True))
        assert after.colocated[0] == after.block_ms
    for name in ("world", "dit"):
        mine = [r for r in out if r.backend == name]
        for lo, hi in zip(mine, mine[1:], strict=False):  # tiers ascend in `rows`
            assert lo.block_ms <= hi.block_ms
            assert all(a <= b for a, b in zip(lo.colocated, hi.colocated, strict=True))
    # a backend's rows bound only its own: the world rows are as if dit were not there
    assert out[:len(world)] == consistent(rows[:len(world)])
