"""The fleet controller on a real stack: the failover tests' stack (`tests/support/stack.py`: nats-server,
fence, two placement instances, the mover; engine hosts as processes) with the controller turned on per test."""

from tests.support.stack import stack  # noqa: F401 (a fixture)
