"""Exact-recovery fixtures: engine hosts as real processes (so one can be SIGKILLed or SIGSTOPped)."""

from tests.support.engine_hosts import hosts  # noqa: F401 (a fixture)
