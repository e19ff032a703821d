"""The device time a host reports is what its stages ran in the window: nothing older, nothing invented."""

from __future__ import annotations

import pytest

from services.engine_host.device_time import DeviceTime


def test_fraction_is_stage_seconds_over_the_window_and_old_work_leaves_it():
    d = DeviceTime(window_s=2.0)
    assert d.fraction(100.0) == 0.0
    for i in range(20):  # a block of 50 ms every 100 ms: half the device
        d.add(100.0 + 0.1 * (i + 1), 0.05)
    assert d.fraction(102.0) == pytest.approx(0.5, abs=0.03)
    assert d.fraction(105.0) == 0.0  # idle for longer than the window


def test_a_young_host_is_not_diluted_by_a_window_it_did_not_run():
    d = DeviceTime(window_s=2.0)
    d.add(10.1, 0.1)
    d.add(10.2, 0.1)
    assert d.fraction(10.2) == pytest.approx(1.0, abs=0.01)  # 0.2 s of work in the 0.2 s since it began
