"""Voice fixtures: a real stack (fence in this process, engine hosts as real processes, so one can be
SIGKILLed) and an HTTP client."""

from tests.support.engine_hosts import hosts  # noqa: F401 (a fixture)
from tests.support.fence import http  # noqa: F401 (a fixture)
