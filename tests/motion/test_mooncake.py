"""Mooncake's transfer engine under our control stream and end-to-end verification (when it imports)."""

from __future__ import annotations

import pytest

from libs import bus
from libs.motion import inprocess, mooncake
from libs.motion.endpoint import MotionEndpoint
from libs.schemas.motion import Manifest, RegisterState
from tests.support.dicthost import DictHost, make_tree, tree_bytes
from tests.support.moves import admit, finish, migrate, verb

pytestmark = pytest.mark.skipif(
    mooncake.TransferEngine is None,
    reason=f"mooncake-transfer-engine-non-cuda does not import here ({mooncake.IMPORT_ERROR}); "
           "it needs the wheel and Debian's libibverbs1")


async def test_mooncake_moves_bytes_we_still_verify(nc):
    a, b = DictHost(), DictHost()
    ea = MotionEndpoint(nc, "a", a, mooncake=mooncake.MooncakeEngine())
    eb = MotionEndpoint(nc, "b", b, mooncake=mooncake.MooncakeEngine())
    await ea.start()
    await eb.start()
    try:
        inprocess.local_receivers.pop(eb.data_addr)
        a.add("s", make_tree(21, leaf_bytes=128 << 10))
        want = tree_bytes(a.trees["s"])
        m = await bus.request(nc, verb("a", "register_state"), RegisterState(session_id="s"), Manifest)
        v = await admit(nc, m, "mc1")
        r = await migrate(nc, v, "mc1", transport="mooncake")
        assert r.manifest.fingerprint == m.fingerprint
        await finish(nc, "mc1", r.manifest)
        assert tree_bytes(b.trees["s"]) == want
    finally:
        await ea.stop()
        await eb.stop()
