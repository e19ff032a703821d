"""The class rules: which classes the engine releases on its own, and at what period."""

from __future__ import annotations

import pytest

from libs.contracts import Contract
from libs.session_classes import BULK_ORDER, PERIODIC, SESSION_CLASSES


def test_every_class_is_either_periodic_or_bulk_once():
    assert sorted(PERIODIC + BULK_ORDER) == sorted(SESSION_CLASSES)


@pytest.mark.parametrize(("contract", "period_ms"), [
    (Contract(session_class="C1", quality_floor=4, determinism="T1", period_ms=200.0), 200.0),
    (Contract(session_class="C2a", quality_floor=4, determinism="T1", deadline_ms=1000.0, blocks_per_window=4),
     250.0),
    (Contract(session_class="C2b", quality_floor=4, determinism="T1", deadline_ms=600.0), 600.0),
    (Contract(session_class="C3", quality_floor=4, determinism="T1", deadline_ms=600.0), 0.0),
    (Contract(session_class="C5", quality_floor=4, determinism="T2", decode_tier="none"), 0.0),
])
def test_release_period_follows_the_class(contract, period_ms):
    assert contract.release_period_ms == period_ms
    assert (contract.release_period_ms > 0) == (contract.session_class in PERIODIC)
