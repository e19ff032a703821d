"""Fence fixtures: one fence service instance on the per-test nats-server, and an HTTP client."""

from tests.support.fence import fence, http  # noqa: F401 (fixtures)
