"""Backends on the shared in-process stack (`tests/support/stack.py`) where a test runs one through fence,
placement and the mover."""

from tests.support.stack import stack  # noqa: F401 (a fixture)
