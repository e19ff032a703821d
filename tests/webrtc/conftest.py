"""A real stack (NATS, fence, placement, mover, two engine hosts, admission) for the WebRTC tests, one per
module, and sessions created through admission's API as the page creates them."""

import pytest

from tests.support.web_stack import sessions, stack  # noqa: F401 (fixtures)

pytest.importorskip("aiortc", reason="the webrtc extra (`make install` installs it)")
