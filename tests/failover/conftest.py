"""Failover tests run on the shared in-process stack (`tests/support/stack.py`)."""

from tests.support.stack import stack  # noqa: F401 (a fixture)
