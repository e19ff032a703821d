"""Admission reads a host at the dearer of its priced and measured load, plus the share its re-queued
`capacity_lost` sessions hold (libs/contracts.py `measured_view`): pure, no bus, no clock."""

from __future__ import annotations

import msgspec
import pytest

from libs.contracts import Guard
from services.admission.core import AdmissionCore, Candidate, Policy
from services.admission.ramp import Ramp
from tests.support.fleet_rows import c1, host


def verdict(**entry: float) -> str:
    """One C1 session (0.1 of the device) offered to h0, priced at 0.5 with `entry`'s fields on top."""
    core = AdmissionCore(Policy(guard=Guard(busy_fraction=0.1), queue_capacity=4, queue_timeout_s=10.0,
                                settle_s=5.0, ramp=Ramp(initial=64)))
    h0 = msgspec.structs.replace(host("h0", busy=0.5, sessions=5), **entry)
    v = core.submit(Candidate(session_id="s", backend="world", contract=c1()), [h0], 1000.0)
    return v.outcome if v.outcome == "admitted" else f"{v.outcome}:{v.estimates[0].reason}"


@pytest.mark.parametrize("entry, outcome", [
    ({}, "admitted"),  # 0.5 + 0.1 within 0.9
    ({"measured_fraction": 0.7}, "admitted"),  # measured 0.7 + 0.1
    ({"measured_fraction": 0.85}, "queued:busy"),  # it measured more than it is priced at: 0.85 + 0.1
    ({"held_fraction": 0.35}, "queued:busy"),  # 0.5 running + 0.35 held for re-queued sessions + 0.1
    ({"measured_fraction": 0.3, "held_fraction": 0.2}, "admitted"),  # priced 0.5 leads, + 0.2 held + 0.1
])
def test_admission_reads_the_dearer_of_priced_and_measured_load_plus_the_held_share(entry, outcome):
    assert verdict(**entry) == outcome
