"""A real stack (NATS, fence, placement, mover, two engine hosts, admission with its pages) and Debian's
Chromium driven by Playwright, shared by the browser tests of one module (starting either costs seconds)."""

from tests.support.browser import artifacts, browser  # noqa: F401 (fixtures)
from tests.support.fence import http  # noqa: F401 (a fixture: test_ws_access takes it)
from tests.support.web_stack import stack  # noqa: F401 (a fixture)
